package ledger

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/relaybus/relaybus/internal/fscount"
	"github.com/relaybus/relaybus/internal/ledger/model"
)

// instances is how many function instances (stores with their own Firestore
// clients) the concurrency tests spread their calls over: calls within one
// instance are coalesced, calls across instances meet in Firestore's
// transactions.
const instances = 4

// writes sums the writes the stores' clients sent, counted at the RPCs.
func writes(counters []*fscount.Counter) int64 {
	var n int64
	for _, c := range counters {
		n += c.Writes()
	}
	return n
}

// 20 rollups of the same event at once, after its last attempt: all
// succeed, every one derives the right status, and one reports the change.
// Counted at the RPCs: the calls within an instance share one rollup, so
// at most one write per instance is sent (a conditional write: the others
// fail their precondition, re-read and find nothing to change), and
// repeated rollups send none.
func TestConcurrentRollupsWriteOnce(t *testing.T) {
	ctx := context.Background()
	stores, counters := newCountedStores(t, instances, Options{})
	s := stores[0]
	seed(t, s, orderTopic, "member-service", "message-service")
	e := newEventOn(t, orderTopic, "order.purchased", time.Now())
	if err := s.RecordSent(ctx, model.SentAt(time.Now(), e)); err != nil {
		t.Fatal(err)
	}
	for _, a := range []model.Attempt{attempt(e, "member-service", 1, model.OutcomeSuccess), attempt(e, "message-service", 1, model.OutcomeFailed)} {
		if _, err := s.InsertAttempt(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	before := writes(counters)
	results := runConcurrently(20, func(i int) (RollupResult, error) { return stores[i%instances].Rollup(ctx, e.ID) })
	changed := 0
	for i, r := range results {
		if r.err != nil {
			t.Errorf("rollup %d: %v", i, r.err)
		}
		if r.res.Status != model.StatusPartial {
			t.Errorf("rollup %d derived %s, want PARTIAL", i, r.res.Status)
		}
		if r.res.Changed {
			changed++
		}
	}
	if changed != 1 {
		t.Errorf("%d calls report the change, want 1", changed)
	}
	w := writes(counters) - before
	if w < 1 || w > instances {
		t.Errorf("%d writes sent for 20 rollups on %d instances, want 1 to %d", w, instances, instances)
	}
	if got := mustGet(t, s, e.ID).Event.Status; got != model.StatusPartial {
		t.Errorf("stored status %s", got)
	}
	// Repeated: nothing more is written.
	for i := 0; i < 3; i++ {
		if res, err := stores[i].Rollup(ctx, e.ID); err != nil || res.Changed {
			t.Errorf("repeated rollup: %+v %v", res, err)
		}
	}
	if again := writes(counters) - before - w; again != 0 {
		t.Errorf("repeated rollups sent %d writes, want none", again)
	}
}

// Attempts keep arriving while 20 rollups run on several instances:
// whatever the interleaving, the rollups that follow the last attempts (as
// every notice follows its attempt) leave the right status.
func TestConcurrentRollupsWhileAttemptsArrive(t *testing.T) {
	ctx := context.Background()
	stores := newStores(t, instances, Options{})
	consumers := []string{"member-service", "message-service", "audit-service"}
	seed(t, stores[0], orderTopic, consumers...)
	e := newEventOn(t, orderTopic, "order.purchased", time.Now())
	if err := stores[0].RecordSent(ctx, model.SentAt(time.Now(), e)); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	rollup := func(i int) {
		defer wg.Done()
		if _, err := stores[i%instances].Rollup(ctx, e.ID); err != nil {
			errs <- err
		}
	}
	for ci, c := range consumers {
		wg.Add(1)
		go func(ci int, c string) {
			defer wg.Done()
			// retry, retry, success: each attempt followed by its notice.
			for n, o := range []model.Outcome{model.OutcomeRetry, model.OutcomeRetry, model.OutcomeSuccess} {
				if _, err := stores[ci%instances].InsertAttempt(ctx, attempt(e, c, n+1, o)); err != nil {
					errs <- err
					return
				}
				wg.Add(1)
				go rollup(ci + n)
			}
		}(ci, c)
	}
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go rollup(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := mustGet(t, stores[0], e.ID).Event.Status; got != model.StatusConsumed {
		t.Errorf("status %s after every consumer succeeded, want CONSUMED", got)
	}
}

// Coalescing: callers that arrive while a rollup runs share one follow-up
// that starts after the running one, never its stale result. In a
// synctest bubble: synctest.Wait says when every caller waits.
func TestCoalescerSharesAFollowUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var c coalescer
		release := make(chan struct{})
		var mu sync.Mutex
		runs := 0
		run := func(context.Context) (RollupResult, error) {
			mu.Lock()
			runs++
			n := runs
			mu.Unlock()
			if n == 1 {
				<-release
			}
			return RollupResult{Expected: n}, nil
		}
		first := make(chan RollupResult)
		go func() { r, _ := c.do(context.Background(), "e", run); first <- r }()
		synctest.Wait() // the first caller's run started and waits
		c.mu.Lock()
		_, started := c.keys["e"]
		c.mu.Unlock()
		if !started {
			t.Fatal("the first caller's run has not started")
		}
		later := make(chan RollupResult, 10)
		run2 := run
		run = func(ctx context.Context) (RollupResult, error) {
			r, err := run2(ctx)
			r.Changed = true
			return r, err
		}
		for i := 0; i < 10; i++ {
			go func() { r, _ := c.do(context.Background(), "e", run); later <- r }()
		}
		synctest.Wait() // the 10 callers wait
		c.mu.Lock()
		f := c.keys["e"].next
		joined := f != nil && f.waiters == 10
		c.mu.Unlock()
		if !joined {
			t.Fatal("the 10 callers do not all wait for the follow-up")
		}
		close(release)
		if r := <-first; r.Expected != 1 {
			t.Errorf("first caller got run %d", r.Expected)
		}
		owners := 0
		for i := 0; i < 10; i++ {
			r := <-later
			if r.Expected != 2 {
				t.Errorf("a caller that arrived during run 1 got run %d, want the follow-up (2)", r.Expected)
			}
			if r.Changed {
				owners++
			} else if !r.Coalesced {
				t.Error("a sharing caller is not marked Coalesced")
			}
		}
		if owners != 1 {
			t.Errorf("%d callers report the follow-up's change, want 1", owners)
		}
		if runs != 2 {
			t.Errorf("%d runs for 11 callers, want 2", runs)
		}
		c.mu.Lock()
		left := len(c.keys)
		c.mu.Unlock()
		if left != 0 {
			t.Errorf("%d keys left behind", left)
		}
	})
}

type rollupOutcome struct {
	res RollupResult
	err error
}

// runConcurrently starts n calls at the same moment.
func runConcurrently(n int, f func(i int) (RollupResult, error)) []rollupOutcome {
	out := make([]rollupOutcome, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			<-start
			res, err := f(i)
			out[i] = rollupOutcome{res, err}
		}(i)
	}
	close(start)
	wg.Wait()
	return out
}
