package rollup

import (
	"context"
	"errors"
	"maps"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/relaybus/relaybus/internal/ledger/model"

	"github.com/relaybus/relaybus/internal/ledger"
)

// The coalescer's tests run in a synctest bubble: its windows and
// pauses pass on the bubble's clock, at once, and synctest.Wait says when
// every goroutine has done what it can.

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

// closeCoalescer closes c at the end of the test and fails it if close
// cut anything short.
func closeCoalescer(t *testing.T, c *coalescer) {
	t.Helper()
	t.Cleanup(func() {
		if err := c.close(context.Background()); err != nil {
			t.Errorf("close: %v", err)
		}
	})
}

// The notices of one event's consumers that arrive within the window cost
// one rollup.
func TestNoticesWithinTheWindowShareOneRollup(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &countingRoll{}
		c := newCoalescer(r.roll, 2*time.Second, time.Millisecond, time.Second, 4)
		closeCoalescer(t, c)
		var wg sync.WaitGroup
		waiting := map[string]int{}
		for _, ids := range [][]string{{"e1"}, {"e1", "e2"}, {"e2"}, {"e1"}} {
			for _, id := range ids {
				waiting[id]++
			}
			want := maps.Clone(waiting)
			wg.Go(func() {
				res, err := c.do(context.Background(), legacy(ids...))
				if err != nil || len(res) != len(ids) {
					t.Errorf("do(%v): %v %v", ids, res, err)
				}
			})
			// The notices arrive one after the other within the window.
			synctest.Wait()
			for id, n := range want {
				checkHeld(t, c, id, func(h *held) bool { return len(h.waiters) == n })
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
	})
}

// A notice that arrives while its event's rollup runs gets a rollup of its
// own after it (the running one may have read before its attempt).
func TestANoticeDuringARollupGetsANewOne(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &countingRoll{hold: make(chan struct{}), started: make(chan struct{})}
		c := newCoalescer(r.roll, 10*time.Millisecond, time.Millisecond, time.Second, 4)
		closeCoalescer(t, c)
		first := make(chan error, 1)
		go func() { _, err := c.do(context.Background(), legacy("e1")); first <- err }()
		<-r.started
		second := make(chan error, 1)
		go func() { _, err := c.do(context.Background(), legacy("e1")); second <- err }()
		synctest.Wait()
		checkHeld(t, c, "e1", func(h *held) bool { return len(h.next) == 1 })
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
	})
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
	synctest.Test(t, func(t *testing.T) {
		r := &countingRoll{}
		c := newCoalescer(r.roll, 100*time.Millisecond, time.Millisecond, time.Second, 4)
		closeCoalescer(t, c)
		var wg sync.WaitGroup
		for _, consumer := range []string{"a", "b", "c"} {
			wg.Go(func() {
				n := model.Notice{EventID: "e1", Attempts: []model.Attempt{{EventID: "e1", ConsumerID: consumer, AttemptNo: 1, Success: true, Outcome: model.OutcomeSuccess}}}
				if _, err := c.do(context.Background(), []model.Notice{n}); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		if len(r.notices) != 1 || len(r.notices[0]) != 1 {
			t.Fatalf("rollups %v, want one rollup of e1", r.calls)
		}
		n := r.notices[0][0]
		if len(n.Attempts) != 3 || n.Legacy {
			t.Fatalf("rolled up %+v, want the three consumers' attempts and no legacy read", n)
		}
	})
}

// An event whose notices carry an attempt of every consumer its topic
// expects is rolled up at once, not at the end of its window; one that
// still waits for a consumer holds until the window ends.
func TestAnEventIsRolledUpOnceEveryConsumerReported(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &countingRoll{}
		c := newCoalescer(r.roll, 3*time.Second, time.Millisecond, time.Second, 4)
		c.expected = func(_ context.Context, topic string) ([]string, error) {
			if topic != "shop.order.events" {
				t.Errorf("expected consumers asked of %q", topic)
			}
			return []string{"a", "b"}, nil
		}
		closeCoalescer(t, c)
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
				synctest.Wait()
				checkHeld(t, c, "e1", func(h *held) bool { return len(h.waiters) == 1 })
			}
		}
		for range 2 {
			if d := <-done; d != 0 {
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
		if d := time.Since(start); d != 3*time.Second {
			t.Errorf("e2 rolled up after %v with b missing, want the whole window (3s)", d)
		}
	})
}

// An event not in the ledger yet is looked for again after growing
// pauses until NotFoundWait has passed since its first notice, then
// answered as it is.
func TestAnEventNotInTheLedgerIsLookedForAgainUntilItsWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var at []time.Duration
		start := time.Now()
		missing := func(_ context.Context, ns []model.Notice) ([]ledger.RollupResult, error) {
			mu.Lock()
			at = append(at, time.Since(start))
			mu.Unlock()
			return []ledger.RollupResult{{EventID: ns[0].EventID, Err: model.ErrEventNotFound}}, nil
		}
		c := newCoalescer(missing, 100*time.Millisecond, 250*time.Millisecond, 10*time.Second, 4)
		closeCoalescer(t, c)
		res, err := c.do(context.Background(), legacy("e1"))
		if err != nil || !errors.Is(res["e1"].Err, model.ErrEventNotFound) {
			t.Fatalf("do: %v %v, want the event answered not found", res, err)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(at) < 4 || at[len(at)-1] < 10*time.Second {
			t.Fatalf("looked for at %v, want several times until 10s had passed", at)
		}
		for i := 2; i < len(at); i++ {
			if gap, prev := at[i]-at[i-1], at[i-1]-at[i-2]; gap < prev/2 {
				t.Errorf("pauses %v then %v: want them growing (looked for at %v)", prev, gap, at)
			}
		}
	})
}

// close returns once what is held is rolled up: at the end of its
// window, not after a poll.
func TestCloseWaitsForWhatIsHeld(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &countingRoll{}
		c := newCoalescer(r.roll, 2*time.Second, time.Millisecond, time.Second, 4)
		answered := make(chan error, 1)
		n := model.Notice{EventID: "e1", Attempts: []model.Attempt{{EventID: "e1", ConsumerID: "a", AttemptNo: 1, Success: true, Outcome: model.OutcomeSuccess}}}
		go func() { _, err := c.do(context.Background(), []model.Notice{n}); answered <- err }()
		synctest.Wait()
		start := time.Now()
		if err := c.close(context.Background()); err != nil {
			t.Fatalf("close: %v", err)
		}
		if d := time.Since(start); d != 2*time.Second {
			t.Errorf("close returned after %v, want when the held event's window ended (2s)", d)
		}
		if err := <-answered; err != nil {
			t.Errorf("the held event: %v", err)
		}
		if _, err := c.do(context.Background(), legacy("e2")); !errors.Is(err, errClosed) {
			t.Errorf("do after close: %v, want errClosed", err)
		}
	})
}

// A rollup that outlasts close's deadline (a window and the not-found
// wait) is cut: close says so, and the notice is answered with an error
// (redelivered), not left to its request's deadline.
func TestCloseSaysWhatItsDeadlineCut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hang := func(ctx context.Context, ns []model.Notice) ([]ledger.RollupResult, error) {
			<-ctx.Done() // a Firestore that does not answer
			return nil, ctx.Err()
		}
		c := newCoalescer(hang, 100*time.Millisecond, time.Millisecond, time.Second, 4)
		answered := make(chan error, 1)
		go func() {
			res, err := c.do(context.Background(), legacy("e1"))
			if err == nil {
				err = res["e1"].Err
			}
			answered <- err
		}()
		time.Sleep(200 * time.Millisecond) // the rollup is running
		synctest.Wait()
		start := time.Now()
		err := c.close(context.Background())
		if err == nil || !strings.Contains(err.Error(), "1 events still held") {
			t.Fatalf("close = %v, want it to say that 1 event was cut short", err)
		}
		if d := time.Since(start); d != 1100*time.Millisecond {
			t.Errorf("close gave up after %v, want its deadline (1.1s: the window and the not-found wait)", d)
		}
		if err := <-answered; err == nil {
			t.Error("the cut event's notice was answered without an error: it would not be redelivered")
		}
		// ctx ending first cuts too.
		c = newCoalescer(hang, 100*time.Millisecond, time.Millisecond, time.Second, 4)
		go func() { _, _ = c.do(context.Background(), legacy("e2")) }()
		time.Sleep(200 * time.Millisecond)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		if err := c.close(ctx); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "1 events still held") {
			t.Errorf("close with a context that ends = %v, want the cut and the context's error", err)
		}
	})
}

// checkHeld fails the test unless the event id is held and cond holds of
// it (call it after synctest.Wait).
func checkHeld(t *testing.T, c *coalescer, id string, cond func(h *held) bool) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if h, ok := c.pending[id]; !ok || !cond(h) {
		t.Fatalf("%s: not held as expected once every goroutine waited", id)
	}
}
