package rollup

import (
	"context"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/relaybus/relaybus/shared/ledger/model"

	"github.com/relaybus/relaybus/shared/ledger"
)

// countingRoll records each rollup's ids and notices and can hold the
// first one.
type countingRoll struct {
	mu      sync.Mutex
	calls   [][]string
	notices [][]model.Notice
	hold    chan struct{}
	started chan struct{}
}

func (c *countingRoll) roll(_ context.Context, ns []model.Notice) ([]ledger.RollupResult, error) {
	ids := make([]string, len(ns))
	for i, n := range ns {
		ids[i] = n.EventID
	}
	c.mu.Lock()
	c.calls = append(c.calls, ids)
	c.notices = append(c.notices, append([]model.Notice(nil), ns...))
	first := len(c.calls) == 1
	c.mu.Unlock()
	if first && c.hold != nil {
		close(c.started)
		<-c.hold
	}
	out := make([]ledger.RollupResult, len(ids))
	for i, id := range ids {
		out[i] = ledger.RollupResult{EventID: id, Status: model.StatusConsumed}
	}
	return out, nil
}

// The notices of one event's consumers that arrive within the window cost
// one rollup.
func TestNoticesWithinTheWindowShareOneRollup(t *testing.T) {
	r := &countingRoll{}
	c := newCoalescer(r.roll, 2*time.Second, time.Millisecond, time.Second, 4)
	defer c.close(context.Background())
	var wg sync.WaitGroup
	waiting := map[string]int{}
	for _, ids := range [][]string{{"e1"}, {"e1", "e2"}, {"e2"}, {"e1"}} {
		for _, id := range ids {
			waiting[id]++
		}
		want := maps.Clone(waiting)
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := c.do(context.Background(), legacy(ids...))
			if err != nil || len(res) != len(ids) {
				t.Errorf("do(%v): %v %v", ids, res, err)
			}
		}()
		// The notices arrive one after the other within the window.
		for id, n := range want {
			waitHeld(t, c, id, func(h *held) bool { return len(h.waiters) == n })
		}
	}
	wg.Wait()
	seen := map[string]int{}
	for _, call := range r.calls {
		for _, id := range call {
			seen[id]++
		}
	}
	if seen["e1"] != 1 || seen["e2"] != 1 {
		t.Fatalf("rollups %v, want each event rolled up once for its notices", r.calls)
	}
}

// A notice that arrives while its event's rollup runs gets a rollup of its
// own after it (the running one may have read before its attempt).
func TestANoticeDuringARollupGetsANewOne(t *testing.T) {
	r := &countingRoll{hold: make(chan struct{}), started: make(chan struct{})}
	c := newCoalescer(r.roll, 10*time.Millisecond, time.Millisecond, time.Second, 4)
	defer c.close(context.Background())
	first := make(chan error, 1)
	go func() { _, err := c.do(context.Background(), legacy("e1")); first <- err }()
	<-r.started
	second := make(chan error, 1)
	go func() { _, err := c.do(context.Background(), legacy("e1")); second <- err }()
	waitHeld(t, c, "e1", func(h *held) bool { return len(h.next) == 1 })
	close(r.hold)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := <-second; err != nil {
		t.Fatal(err)
	}
	if len(r.calls) != 2 {
		t.Fatalf("rollups %v, want two: the running one and one after it", r.calls)
	}
}

// legacy returns the notices of ids without attempts.
func legacy(ids ...string) []model.Notice {
	out := make([]model.Notice, len(ids))
	for i, id := range ids {
		out[i] = model.Notice{EventID: id, Legacy: true}
	}
	return out
}

// The attempts that the notices of one event's consumers carry within the
// window reach one rollup together.
func TestNoticesWithinTheWindowShareTheirAttempts(t *testing.T) {
	r := &countingRoll{}
	c := newCoalescer(r.roll, 100*time.Millisecond, time.Millisecond, time.Second, 4)
	defer c.close(context.Background())
	var wg sync.WaitGroup
	for _, consumer := range []string{"a", "b", "c"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := model.Notice{EventID: "e1", Attempts: []model.Attempt{{EventID: "e1", ConsumerID: consumer, AttemptNo: 1, Success: true, Outcome: model.OutcomeSuccess}}}
			if _, err := c.do(context.Background(), []model.Notice{n}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if len(r.notices) != 1 || len(r.notices[0]) != 1 {
		t.Fatalf("rollups %v, want one rollup of e1", r.calls)
	}
	n := r.notices[0][0]
	if len(n.Attempts) != 3 || n.Legacy {
		t.Fatalf("rolled up %+v, want the three consumers' attempts and no legacy read", n)
	}
}

// An event whose notices carry an attempt of every consumer its topic
// expects is rolled up at once, not at the end of its window; one that
// still waits for a consumer holds until the window ends.
func TestAnEventIsRolledUpOnceEveryConsumerReported(t *testing.T) {
	r := &countingRoll{}
	c := newCoalescer(r.roll, 3*time.Second, time.Millisecond, time.Second, 4)
	c.expected = func(_ context.Context, topic string) ([]string, error) {
		if topic != "shop.order.events" {
			t.Errorf("expected consumers asked of %q", topic)
		}
		return []string{"a", "b"}, nil
	}
	defer c.close(context.Background())
	notice := func(id, consumer string) []model.Notice {
		return []model.Notice{{EventID: id, Attempts: []model.Attempt{{EventID: id, ConsumerID: consumer, AttemptNo: 1,
			Success: true, Outcome: model.OutcomeSuccess, Topic: "shop.order.events"}}}}
	}
	start := time.Now()
	done := make(chan time.Duration, 2)
	for _, consumer := range []string{"a", "b"} {
		go func() {
			if _, err := c.do(context.Background(), notice("e1", consumer)); err != nil {
				t.Error(err)
			}
			done <- time.Since(start)
		}()
		if consumer == "a" { // b reports after a
			waitHeld(t, c, "e1", func(h *held) bool { return len(h.waiters) == 1 })
		}
	}
	for range 2 {
		if d := <-done; d > time.Second {
			t.Errorf("answered after %v, want at once once both consumers reported (window 3 s)", d)
		}
	}
	if len(r.calls) != 1 || len(r.notices[0][0].Attempts) != 2 {
		t.Fatalf("rollups %v, want one with both attempts", r.calls)
	}
	// Only a of e2's consumers reports: held to the end of the window.
	start = time.Now()
	if _, err := c.do(context.Background(), notice("e2", "a")); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 3*time.Second {
		t.Errorf("e2 rolled up after %v with b missing, want the whole window", d)
	}
}

// waitHeld waits until the event id is held and cond holds of it.
func waitHeld(t *testing.T, c *coalescer, id string, cond func(h *held) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c.mu.Lock()
		h, ok := c.pending[id]
		met := ok && cond(h)
		c.mu.Unlock()
		if met {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the condition never held", id)
		}
		time.Sleep(time.Millisecond)
	}
}
