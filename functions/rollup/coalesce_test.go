package rollup

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/relaybus/relaybus/shared/ledger"
)

// countingRoll records each rollup's ids and notices and can hold the
// first one.
type countingRoll struct {
	mu      sync.Mutex
	calls   [][]string
	notices [][]ledger.Notice
	hold    chan struct{}
	started chan struct{}
}

func (c *countingRoll) roll(_ context.Context, ns []ledger.Notice) ([]ledger.RollupResult, error) {
	ids := make([]string, len(ns))
	for i, n := range ns {
		ids[i] = n.EventID
	}
	c.mu.Lock()
	c.calls = append(c.calls, ids)
	c.notices = append(c.notices, append([]ledger.Notice(nil), ns...))
	first := len(c.calls) == 1
	c.mu.Unlock()
	if first && c.hold != nil {
		close(c.started)
		<-c.hold
	}
	out := make([]ledger.RollupResult, len(ids))
	for i, id := range ids {
		out[i] = ledger.RollupResult{EventID: id, Status: ledger.StatusConsumed}
	}
	return out, nil
}

// The notices of one event's consumers that arrive within the window cost
// one rollup.
func TestNoticesWithinTheWindowShareOneRollup(t *testing.T) {
	r := &countingRoll{}
	c := newCoalescer(r.roll, 100*time.Millisecond, time.Millisecond, time.Second, 4)
	defer c.close(context.Background())
	var wg sync.WaitGroup
	for _, ids := range [][]string{{"e1"}, {"e1", "e2"}, {"e2"}, {"e1"}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := c.do(context.Background(), legacy(ids...))
			if err != nil || len(res) != len(ids) {
				t.Errorf("do(%v): %v %v", ids, res, err)
			}
		}()
		time.Sleep(10 * time.Millisecond)
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
	time.Sleep(30 * time.Millisecond)
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
func legacy(ids ...string) []ledger.Notice {
	out := make([]ledger.Notice, len(ids))
	for i, id := range ids {
		out[i] = ledger.Notice{EventID: id, Legacy: true}
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
			n := ledger.Notice{EventID: "e1", Attempts: []ledger.Attempt{{EventID: "e1", ConsumerID: consumer, AttemptNo: 1, Success: true, Outcome: ledger.OutcomeSuccess}}}
			if _, err := c.do(context.Background(), []ledger.Notice{n}); err != nil {
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
	notice := func(id, consumer string) []ledger.Notice {
		return []ledger.Notice{{EventID: id, Attempts: []ledger.Attempt{{EventID: id, ConsumerID: consumer, AttemptNo: 1,
			Success: true, Outcome: ledger.OutcomeSuccess, Topic: "shop.order.events"}}}}
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
		time.Sleep(20 * time.Millisecond)
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
