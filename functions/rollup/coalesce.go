package rollup

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/relaybus/relaybus/internal/retry"

	"github.com/relaybus/relaybus/internal/ledger/model"

	"github.com/relaybus/relaybus/internal/ledger"
)

// coalescer holds each event a notice names for a window before rolling it
// up, so that the notices of an event's consumers that arrive within the
// window (they are delivered together, and report within moments of each
// other) cost one rollup: one read of the event and one write with every
// consumer's outcome folded in (ledger.Store.Fold), instead of one rollup
// per consumer. The attempts the notices carry are gathered per event. Due events are rolled up together,
// in batches of ledger.MaxNoticeEvents, by a few workers. An event not in
// the ledger yet is held again (notFoundPause doubling, ±20% jitter:
// retry.Policy) until notFoundWait has passed since its first notice, then
// answered as it is.
type coalescer struct {
	roll func(ctx context.Context, notices []model.Notice) ([]ledger.RollupResult, error)
	// expected, when set, names the consumers of a topic's events: an
	// event whose notices carry an attempt of each is rolled up at once
	// instead of at the end of its window.
	expected func(ctx context.Context, topic string) ([]string, error)
	// minHold is the least an event whose consumers have all reported is
	// held from its first notice: its write waits that long after the
	// event's send anyway (the write gap), and the send, recorded in the
	// background, is then in the ledger.
	minHold       time.Duration
	window        time.Duration
	notFoundPause time.Duration
	notFoundWait  time.Duration
	workers       int

	mu      sync.Mutex
	pending map[string]*held
	wake    chan struct{}
	// settled is signalled whenever held events were answered (close
	// waits on it).
	settled chan struct{}
	closed  bool // close has answered what was held: take nothing more
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
	notice, nextNotice model.Notice
	// expected are the consumers the event waits for (none: unknown).
	expected []string
	// notFound counts the rollups that did not find the event in the
	// ledger: the next waits notFoundPolicy's wait for that retry.
	notFound int
	// next are the waiters that arrived while a rollup was running: it
	// may have read before their attempts, so they get a rollup of their
	// own after it.
	next []chan ledger.RollupResult
}

// legacyWindow is how long a notice without attempts (the former shape)
// holds its event: its attempts are documents, read by the rollup.
const legacyWindow = 250 * time.Millisecond

// complete reports whether the gathered notices carry an attempt of every
// expected consumer.
func (h *held) complete() bool {
	if len(h.expected) == 0 {
		return false
	}
	have := make(map[string]bool, len(h.notice.Attempts))
	for _, a := range h.notice.Attempts {
		have[a.ConsumerID] = true
	}
	for _, c := range h.expected {
		if !have[c] {
			return false
		}
	}
	return true
}

// maxHeld bounds the events held at once; past it a notice is refused (and
// redelivered by Pub/Sub).
const maxHeld = 100_000

func newCoalescer(roll func(ctx context.Context, notices []model.Notice) ([]ledger.RollupResult, error), window, notFoundPause, notFoundWait time.Duration, workers int) *coalescer {
	c := &coalescer{roll: roll, window: window, notFoundPause: notFoundPause, notFoundWait: notFoundWait, workers: workers,
		pending: map[string]*held{}, wake: make(chan struct{}, 1), settled: make(chan struct{}, 1)}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.wg.Add(1)
	go c.dispatch()
	return c
}

// errBusy means the coalescer holds too many events to take more.
var errBusy = errors.New("rollup: too many events waiting")

// gather adds what a notice says of an event to what is held of it.
func gather(into *model.Notice, n model.Notice) {
	into.EventID = n.EventID
	into.Attempts = append(into.Attempts, n.Attempts...)
	into.Legacy = into.Legacy || n.Legacy
}

// do holds the notices' events for the window and returns each one's
// rollup, or ctx's end.
func (c *coalescer) do(ctx context.Context, notices []model.Notice) (map[string]ledger.RollupResult, error) {
	chans := make(map[string]chan ledger.RollupResult, len(notices))
	expected := map[string][]string{} // by topic
	if c.expected != nil {
		for _, n := range notices {
			if len(n.Attempts) == 0 {
				continue
			}
			topic := n.Attempts[0].Topic
			if _, ok := expected[topic]; ok || topic == "" {
				continue
			}
			cs, err := c.expected(ctx, topic)
			if err != nil {
				cs = nil // the window alone decides
			}
			expected[topic] = cs
		}
	}
	now := time.Now()
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, errClosed
	}
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
			hold := c.window
			if len(n.Attempts) == 0 {
				hold = min(hold, legacyWindow)
			}
			h = &held{due: now.Add(hold), first: now}
			c.pending[id] = h
		case h.running:
			h.next = append(h.next, ch)
			gather(&h.nextNotice, n)
			continue
		}
		h.waiters = append(h.waiters, ch)
		gather(&h.notice, n)
		if len(n.Attempts) > 0 && h.expected == nil {
			h.expected = expected[n.Attempts[0].Topic]
		}
		if h.complete() {
			// Every consumer has reported: no reason to wait longer.
			h.due = maxTime(now, h.first.Add(c.minHold))
		}
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
		var due []model.Notice
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
			n := min(len(due), model.MaxNoticeEvents)
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
func (c *coalescer) run(notices []model.Notice) {
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
		if errors.Is(r.Err, model.ErrEventNotFound) && now.Sub(h.first) < c.notFoundWait {
			h.notFound++
			h.running, h.due = false, now.Add(retry.Policy{Initial: c.notFoundPause, Max: c.notFoundWait}.Delay(h.notFound))
			continue
		}
		for _, ch := range h.waiters {
			ch <- r
		}
		if len(h.next) > 0 {
			// The notices that came during the rollup are held a window of
			// their own, so their consumers' outcomes share one write.
			h.waiters, h.next, h.running, h.due, h.first = h.next, nil, false, now.Add(c.window), now
			h.notice, h.nextNotice = h.nextNotice, model.Notice{}
			if h.complete() {
				h.due = maxTime(now, h.first.Add(c.minHold))
			}
			continue
		}
		delete(c.pending, id)
	}
	for _, ch := range []chan struct{}{c.wake, c.settled} {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// errClosed answers the notices of events still held when the coalescer
// closed: they are redelivered (to the next instance).
var errClosed = errors.New("rollup: shutting down before the event was rolled up")

// close stops dispatching once the events held now are rolled up, or ctx
// ends, or the longest an event can be held (a window and the wait for an
// event not in the ledger yet) has passed. What is still held then is
// answered errClosed (its notices are redelivered), and close says how
// many events were cut short.
func (c *coalescer) close(ctx context.Context) error {
	deadline := time.NewTimer(c.window + c.notFoundWait)
	defer deadline.Stop()
	var cut error
wait:
	for {
		c.mu.Lock()
		n := len(c.pending)
		c.mu.Unlock()
		if n == 0 {
			break
		}
		select {
		case <-c.settled:
		case <-ctx.Done():
			cut = fmt.Errorf("rollup: %d events still held at shutdown: %w", n, ctx.Err())
			break wait
		case <-deadline.C:
			cut = fmt.Errorf("rollup: %d events still held %v after shutdown began", n, c.window+c.notFoundWait)
			break wait
		}
	}
	c.cancel()
	c.wg.Wait()
	// The running rollups have answered (their context ended); the rest
	// are answered now rather than left to their requests' deadlines.
	c.mu.Lock()
	c.closed = true
	for id, h := range c.pending {
		for _, ch := range append(h.waiters, h.next...) {
			ch <- ledger.RollupResult{EventID: id, Err: errClosed}
		}
		delete(c.pending, id)
	}
	c.mu.Unlock()
	return cut
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
