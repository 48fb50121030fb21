package pull

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/relaybus/relaybus/internal/delivery"
	"github.com/relaybus/relaybus/shared/event"
)

// The worker's tests run it over a fake source in a synctest bubble: its
// backoffs, lease renewals and pulls pass on the bubble's clock, and
// synctest.Wait says when the worker has done all it can.

func TestNewNamesTheMissingOption(t *testing.T) {
	_, err := New(Options{})
	if err == nil || !strings.Contains(err.Error(), "Options.Source is required") {
		t.Fatalf("New(Options{}) = %v, want the missing Source named", err)
	}
}

// source is a broker in memory: Pull hands out what was offered (waiting
// up to a second for it, as a broker's poll does), and every lease
// records what was done with it.
type source struct {
	mu      sync.Mutex
	queue   []*lease
	offered chan struct{}
	log     []string // "ack k-1#1", "nack k-2#1", "extend k-1#1" in order
	failOne bool     // the next pull fails after handing out what it has
	pulls   int
}

func newSource() *source { return &source{offered: make(chan struct{}, 1)} }

// offer queues a delivery of m (its ID is the event id; attempt counts
// the broker's deliveries of it).
func (s *source) offer(key string, n, attempt int) *lease {
	id := fmt.Sprintf("%s-%d", key, n)
	l := &lease{s: s, name: fmt.Sprintf("%s#%d", id, attempt), m: event.Message{ID: id, OrderingKey: key, DeliveryAttempt: attempt,
		Attributes: map[string]string{event.AttrEventID: id, "n": strconv.Itoa(n)}}}
	s.mu.Lock()
	s.queue = append(s.queue, l)
	s.mu.Unlock()
	select {
	case s.offered <- struct{}{}:
	default:
	}
	return l
}

func (s *source) Pull(ctx context.Context, _ string, max int) ([]Leased, error) {
	t := time.NewTimer(time.Second)
	defer t.Stop()
	for {
		s.mu.Lock()
		if len(s.queue) > 0 || s.failOne {
			n := min(max, len(s.queue))
			out := make([]Leased, n)
			for i, l := range s.queue[:n] {
				out[i] = l
			}
			s.queue = s.queue[n:]
			s.pulls++
			var err error
			if s.failOne {
				s.failOne, err = false, errors.New("status 409 Leadership Change")
			}
			s.mu.Unlock()
			return out, err
		}
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, nil
		case <-t.C:
			return nil, nil
		case <-s.offered:
		}
	}
}

func (s *source) record(what string) {
	s.mu.Lock()
	s.log = append(s.log, what)
	s.mu.Unlock()
}

// logOf returns the recorded actions starting with prefix.
func (s *source) logOf(prefix string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, l := range s.log {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return out
}

type lease struct {
	s    *source
	name string
	m    event.Message
}

func (l *lease) Message() event.Message { return l.m }
func (l *lease) Ack(context.Context) error {
	l.s.record("ack " + l.name)
	return nil
}
func (l *lease) Nack(context.Context, time.Duration) error {
	l.s.record("nack " + l.name)
	return nil
}
func (l *lease) Extend(context.Context) error {
	l.s.record("extend " + l.name)
	return nil
}

// engine records what it applied per key and when, refuses what refuse
// says, and can hold deliveries until released.
type engine struct {
	mu       sync.Mutex
	refuse   func(m event.Message, attempt int) bool
	attempts map[string]int
	applied  map[string][]int
	at       map[string][]time.Duration // per event id, each attempt's time from start
	start    time.Time
	running  map[string]bool
	overlap  string
	hold     chan struct{} // when set, each delivery waits for it to be closed
}

func newEngine() *engine {
	return &engine{attempts: map[string]int{}, applied: map[string][]int{}, at: map[string][]time.Duration{},
		running: map[string]bool{}, start: time.Now()}
}

func (e *engine) Handle(_ context.Context, d delivery.Delivery) Answer {
	m := d.Message
	id := m.Attributes[event.AttrEventID]
	e.mu.Lock()
	if e.running[m.OrderingKey] {
		e.overlap = m.OrderingKey
	}
	e.running[m.OrderingKey] = true
	e.attempts[id]++
	n := e.attempts[id]
	e.at[id] = append(e.at[id], time.Since(e.start))
	hold := e.hold
	e.mu.Unlock()
	if hold != nil {
		<-hold
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.running[m.OrderingKey] = false
	if e.refuse != nil && e.refuse(m, n) {
		return Answer{Status: http.StatusServiceUnavailable, EventID: id, Attempt: n}
	}
	v, _ := strconv.Atoi(m.Attributes["n"])
	e.applied[m.OrderingKey] = append(e.applied[m.OrderingKey], v)
	return Answer{Status: http.StatusOK, EventID: id, Attempt: n}
}

type discard struct{}

func (discard) Publish(context.Context, string, event.Message) (string, error) { return "", nil }

// run starts a worker over o (Source, Engine and DeadLetters filled in
// when nil) and returns a stop that cancels it and waits for Run.
func run(t *testing.T, o Options) (stop func()) {
	t.Helper()
	if o.DeadLetters == nil {
		o.DeadLetters = discard{}
	}
	o.Subscription = "s"
	w, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// A pull that fails after the broker leased it messages (a batch cut
// short) returns them with its error; the worker delivers them instead of
// leaving their leases to lapse.
func TestMessagesOfAFailedPullAreDelivered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src, eng := newSource(), newEngine()
		src.failOne = true
		src.offer("k", 1, 1)
		run(t, Options{Source: src, Engine: eng, MinBackoff: time.Millisecond})
		synctest.Wait()
		if got := src.logOf("ack"); !slices.Equal(got, []string{"ack k-1#1"}) {
			t.Fatalf("acknowledged %v, want the message the failed pull returned", got)
		}
	})
}

// Refused messages wait out the backoff (at least MinBackoff·2^(n-1))
// with their key's later messages queued behind them; other keys go on.
func TestRefusalsHoldOnlyTheirKeyForTheBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src, eng := newSource(), newEngine()
		eng.refuse = func(m event.Message, attempt int) bool { return m.ID == "a-1" && attempt < 3 }
		for n := 1; n <= 3; n++ {
			src.offer("a", n, 1)
			src.offer("b", n, 1)
		}
		run(t, Options{Source: src, Engine: eng, MinBackoff: 100 * time.Millisecond, MaxBackoff: time.Second})
		time.Sleep(time.Second)
		synctest.Wait()
		eng.mu.Lock()
		defer eng.mu.Unlock()
		if got := fmt.Sprint(eng.applied["a"], eng.applied["b"]); got != "[1 2 3] [1 2 3]" {
			t.Fatalf("applied a %v, b %v; want each key in order", eng.applied["a"], eng.applied["b"])
		}
		if eng.overlap != "" {
			t.Errorf("key %s had two deliveries at once", eng.overlap)
		}
		at := eng.at["a-1"]
		if len(at) != 3 || at[1]-at[0] < 100*time.Millisecond || at[1]-at[0] > 120*time.Millisecond ||
			at[2]-at[1] < 200*time.Millisecond || at[2]-at[1] > 240*time.Millisecond {
			t.Errorf("a-1 tried at %v; want retries after 100-120 ms, then 200-240 ms", at)
		}
		if b3 := eng.at["b-3"]; len(b3) != 1 || b3[0] != 0 {
			t.Errorf("b-3 delivered at %v, want at once: another key's backoff held it", b3)
		}
		if a2 := eng.at["a-2"]; len(a2) != 1 || a2[0] < at[2] {
			t.Errorf("a-2 delivered at %v, before a-1 was accepted at %v", a2, at[2])
		}
	})
}

// Held messages' leases are renewed every ExtendEvery, and never once the
// message is settled.
func TestLeasesAreRenewedUntilSettled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src, eng := newSource(), newEngine()
		eng.hold = make(chan struct{})
		src.offer("k", 1, 1)
		run(t, Options{Source: src, Engine: eng, ExtendEvery: 10 * time.Second})
		time.Sleep(25 * time.Second)
		synctest.Wait()
		close(eng.hold)
		synctest.Wait()
		time.Sleep(time.Minute)
		synctest.Wait()
		if got := fmt.Sprint(src.logOf("")); got != "[extend k-1#1 extend k-1#1 ack k-1#1]" {
			t.Fatalf("lease actions %s; want two renewals while it was handled (10 s, 20 s), then its ack, and nothing after", got)
		}
	})
}

// At shutdown the delivery in flight finishes and is acknowledged; what
// was queued behind it is handed back in its key's order, once the last
// pull has returned (a pull still open could take a handed-back message
// ahead of its key's next one).
func TestShutdownHandsBackInOrderAfterTheLastPull(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src, eng := newSource(), newEngine()
		eng.hold = make(chan struct{})
		for n := 1; n <= 3; n++ {
			src.offer("k", n, 1)
		}
		stop := run(t, Options{Source: src, Engine: eng})
		synctest.Wait() // k-1 in the engine, the next pull waiting
		stopped := make(chan struct{})
		go func() { stop(); close(stopped) }()
		synctest.Wait()
		close(eng.hold)
		<-stopped
		if got := fmt.Sprint(src.logOf("")); got != "[ack k-1#1 nack k-2#1 nack k-3#1]" {
			t.Fatalf("settled %s; want k-1 acknowledged, then k-2 and k-3 handed back in order", got)
		}
	})
}

// A message whose lease lapsed comes back while the worker still holds
// it (its lease renewal was late: a busy machine, a slow broker). The new
// delivery takes the held one's place in its key's queue, under the new
// lease: the message is delivered once, in order, and settled with the
// lease the broker knows now. Queued behind its key's later messages it
// was delivered again after them (k-3 before k-2's second delivery), and
// handed back after them at shutdown; the NATS conformance flake.
func TestARedeliveryOfAHeldMessageTakesItsPlace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src, eng := newSource(), newEngine()
		eng.hold = make(chan struct{})
		for n := 1; n <= 3; n++ {
			src.offer("k", n, 1)
		}
		stop := run(t, Options{Source: src, Engine: eng})
		synctest.Wait() // k-1 in the engine, k-2 and k-3 queued
		src.offer("k", 2, 2)
		synctest.Wait()
		close(eng.hold)
		synctest.Wait()
		stop()
		eng.mu.Lock()
		defer eng.mu.Unlock()
		if got := eng.applied["k"]; fmt.Sprint(got) != "[1 2 3]" {
			t.Errorf("applied %v, want [1 2 3]: each once, in order", got)
		}
		if got := fmt.Sprint(src.logOf("")); got != "[ack k-1#1 ack k-2#2 ack k-3#1]" {
			t.Errorf("settled %s; want k-2 acknowledged once, under its new lease, between k-1 and k-3", got)
		}

		// At shutdown the same: handed back once, in order.
		src2, eng2 := newSource(), newEngine()
		eng2.hold = make(chan struct{})
		for n := 1; n <= 3; n++ {
			src2.offer("k", n, 1)
		}
		stop = run(t, Options{Source: src2, Engine: eng2})
		synctest.Wait()
		src2.offer("k", 2, 2)
		synctest.Wait()
		stopped := make(chan struct{})
		go func() { stop(); close(stopped) }()
		synctest.Wait()
		close(eng2.hold)
		<-stopped
		if got := fmt.Sprint(src2.logOf("")); got != "[ack k-1#1 nack k-2#2 nack k-3#1]" {
			t.Errorf("at shutdown settled %s; want k-2 handed back once, under its new lease, before k-3", got)
		}
	})
}

// countingDL counts dead letters.
type countingDL struct{ n atomic.Int64 }

func (c *countingDL) Publish(context.Context, string, event.Message) (string, error) {
	c.n.Add(1)
	return "", nil
}

// heldEngine holds the first holds deliveries back (Answer.Held, as a
// forward consumer's open breaker does), then accepts; it records the
// delivery attempt each delivery was handed and when.
type heldEngine struct {
	mu       sync.Mutex
	holds    int
	seen     []int
	at       []time.Duration
	start    time.Time
	accepted []string
}

func (e *heldEngine) Handle(_ context.Context, d delivery.Delivery) Answer {
	e.mu.Lock()
	defer e.mu.Unlock()
	if d.Message.OrderingKey == "a" && len(e.seen) < e.holds {
		e.seen = append(e.seen, d.Message.DeliveryAttempt)
		e.at = append(e.at, time.Since(e.start))
		return Answer{Status: http.StatusServiceUnavailable, Code: "held", Held: true, RetryAfter: 250 * time.Millisecond}
	}
	e.accepted = append(e.accepted, d.Message.ID)
	return Answer{Status: http.StatusOK, Attempt: 1}
}

// A delivery the engine holds back is not an attempt: the worker keeps
// the message under its lease, retries it after the engine's RetryAfter
// with the broker's delivery count unchanged, however many times it is
// held (far past MaxAttempts), never dead-letters nor hands it back, and
// delivers its key's later messages after it.
func TestHeldDeliveriesAreNotAttempts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := newSource()
		eng := &heldEngine{holds: 20, start: time.Now()}
		dl := &countingDL{}
		src.offer("a", 1, 1)
		src.offer("a", 2, 1)
		run(t, Options{Source: src, Engine: eng, DeadLetters: dl, MaxAttempts: 3, MinBackoff: 10 * time.Millisecond})
		time.Sleep(10 * time.Second)
		synctest.Wait()
		eng.mu.Lock()
		defer eng.mu.Unlock()
		if n := dl.n.Load(); n != 0 {
			t.Fatalf("%d dead letters after %d held deliveries; want none", n, eng.holds)
		}
		if got := src.logOf("nack"); len(got) != 0 {
			t.Errorf("handed back %v; want the held message kept under its lease", got)
		}
		if !slices.Equal(eng.accepted, []string{"a-1", "a-2"}) {
			t.Errorf("accepted %v, want a-1 then a-2", eng.accepted)
		}
		for i, a := range eng.seen {
			if a != 1 {
				t.Fatalf("held delivery %d was handed delivery attempt %d; want 1 each time", i+1, a)
			}
			if i > 0 && eng.at[i]-eng.at[i-1] < 250*time.Millisecond {
				t.Fatalf("held delivery %d came %s after the previous one; want the RetryAfter, 250ms", i+1, eng.at[i]-eng.at[i-1])
			}
		}
	})
}
