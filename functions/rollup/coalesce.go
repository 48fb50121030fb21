package rollup

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/relaybus/relaybus/shared/ledger"
)

// coalescer holds each event a notice names for a window before rolling it
// up, so that the notices of an event's consumers that arrive within the
// window (they are delivered together, and report within moments of each
// other) cost one rollup: one read of the event and one write with every
// consumer's outcome folded in (ledger.Store.Fold), instead of one rollup
// per consumer. The attempts the notices carry are gathered per event. Due events are rolled up together,
// in batches of ledger.MaxNoticeEvents, by a few workers. An event not in
// the ledger yet is held again (notFoundPause) until notFoundWait has
// passed since its first notice, then answered as it is.
type coalescer struct {
	roll          func(ctx context.Context, notices []ledger.Notice) ([]ledger.RollupResult, error)
	window        time.Duration
	notFoundPause time.Duration
	notFoundWait  time.Duration
	workers       int

	mu      sync.Mutex
	pending map[string]*held
	wake    chan struct{}
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// held is one event waiting for its rollup.
type held struct {
	due     time.Time // when it is rolled up
	first   time.Time // its first notice
	running bool
	waiters []chan ledger.RollupResult
	// notice gathers what the waiters' notices said of the event; next
	// what the notices that arrived during a running rollup said.
	notice, nextNotice ledger.Notice
	// next are the waiters that arrived while a rollup was running: it
	// may have read before their attempts, so they get a rollup of their
	// own after it.
	next []chan ledger.RollupResult
}

// maxHeld bounds the events held at once; past it a notice is refused (and
// redelivered by Pub/Sub).
const maxHeld = 100_000

func newCoalescer(roll func(ctx context.Context, notices []ledger.Notice) ([]ledger.RollupResult, error), window, notFoundPause, notFoundWait time.Duration, workers int) *coalescer {
	c := &coalescer{roll: roll, window: window, notFoundPause: notFoundPause, notFoundWait: notFoundWait, workers: workers,
		pending: map[string]*held{}, wake: make(chan struct{}, 1)}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.wg.Add(1)
	go c.dispatch()
	return c
}

// errBusy means the coalescer holds too many events to take more.
var errBusy = errors.New("rollup: too many events waiting")

// gather adds what a notice says of an event to what is held of it.
func gather(into *ledger.Notice, n ledger.Notice) {
	into.EventID = n.EventID
	into.Attempts = append(into.Attempts, n.Attempts...)
	into.Legacy = into.Legacy || n.Legacy
}

// do holds the notices' events for the window and returns each one's
// rollup, or ctx's end.
func (c *coalescer) do(ctx context.Context, notices []ledger.Notice) (map[string]ledger.RollupResult, error) {
	chans := make(map[string]chan ledger.RollupResult, len(notices))
	now := time.Now()
	c.mu.Lock()
	if len(c.pending)+len(notices) > maxHeld {
		c.mu.Unlock()
		return nil, errBusy
	}
	for _, n := range notices {
		id := n.EventID
		ch := make(chan ledger.RollupResult, 1)
		chans[id] = ch
		h, ok := c.pending[id]
		switch {
		case !ok:
			h = &held{due: now.Add(c.window), first: now}
			c.pending[id] = h
		case h.running:
			h.next = append(h.next, ch)
			gather(&h.nextNotice, n)
			continue
		}
		h.waiters = append(h.waiters, ch)
		gather(&h.notice, n)
	}
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
	out := make(map[string]ledger.RollupResult, len(notices))
	for id, ch := range chans {
		select {
		case r := <-ch:
			out[id] = r
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return out, nil
}

// dispatch rolls up the events that are due, in batches.
func (c *coalescer) dispatch() {
	defer c.wg.Done()
	sem := make(chan struct{}, c.workers)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := time.Now()
		var due []ledger.Notice
		next := now.Add(time.Hour)
		c.mu.Lock()
		for _, h := range c.pending {
			switch {
			case h.running:
			case !h.due.After(now):
				h.running = true
				due = append(due, h.notice)
			case h.due.Before(next):
				next = h.due
			}
		}
		c.mu.Unlock()
		for len(due) > 0 {
			n := min(len(due), ledger.MaxNoticeEvents)
			batch := due[:n]
			due = due[n:]
			sem <- struct{}{}
			c.wg.Add(1)
			go func() {
				defer c.wg.Done()
				defer func() { <-sem }()
				c.run(batch)
			}()
		}
		timer.Reset(time.Until(next))
		select {
		case <-c.ctx.Done():
			return
		case <-c.wake:
		case <-timer.C:
		}
	}
}

// rollTimeout bounds one batch's rollup: a Firestore that hangs fails it
// (the notices are redelivered) instead of holding the events for good.
const rollTimeout = 30 * time.Second

// run rolls up ids and answers their waiters, or holds again the events
// not in the ledger yet.
func (c *coalescer) run(notices []ledger.Notice) {
	ctx, cancel := context.WithTimeout(c.ctx, rollTimeout)
	rs, err := c.roll(ctx, notices)
	cancel()
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, n := range notices {
		id := n.EventID
		h := c.pending[id]
		var r ledger.RollupResult
		if err != nil {
			r = ledger.RollupResult{EventID: id, Err: err}
		} else {
			r = rs[i]
		}
		if errors.Is(r.Err, ledger.ErrEventNotFound) && now.Sub(h.first) < c.notFoundWait {
			h.running, h.due = false, now.Add(c.notFoundPause)
			continue
		}
		for _, ch := range h.waiters {
			ch <- r
		}
		if len(h.next) > 0 {
			// The notices that came during the rollup are held a window of
			// their own, so their consumers' outcomes share one write.
			h.waiters, h.next, h.running, h.due, h.first = h.next, nil, false, now.Add(c.window), now
			h.notice, h.nextNotice = h.nextNotice, ledger.Notice{}
			continue
		}
		delete(c.pending, id)
	}
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// close stops dispatching once the events held now are rolled up, or ctx
// ends.
func (c *coalescer) close(ctx context.Context) error {
	deadline := time.Now().Add(c.window + c.notFoundWait)
	for {
		c.mu.Lock()
		n := len(c.pending)
		c.mu.Unlock()
		if n == 0 || ctx.Err() != nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.cancel()
	c.wg.Wait()
	return ctx.Err()
}
