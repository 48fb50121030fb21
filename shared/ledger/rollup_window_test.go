package ledger

import (
	"context"
	"testing"
	"time"
)

// A rollup reads only the attempts after the marks the event's document
// keeps, by id; these walk an event through attempt numbers inside and
// past that window, and through a gap only the reconciler reads across.
func TestRollupFollowsAttemptsPastItsMarks(t *testing.T) {
	ctx := context.Background()
	clock := &testClock{t: time.Now().UTC()}
	s := newStore(t, Options{Now: clock.now, ReconcileAfter: time.Minute})
	seed(t, s, orderTopic, "billing", "shipping")
	step := func(e string, want Status) {
		t.Helper()
		r, err := s.Rollup(ctx, e)
		if err != nil {
			t.Fatal(err)
		}
		if r.Status != want {
			t.Fatalf("status %s, want %s", r.Status, want)
		}
	}
	insert := func(as ...Attempt) {
		t.Helper()
		if err := s.InsertAttempts(ctx, as); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("marks advance one attempt at a time", func(t *testing.T) {
		e := newEventOn(t, orderTopic, "order.purchased", clock.t)
		if err := s.RecordSent(ctx, SentAt(clock.t, e)); err != nil {
			t.Fatal(err)
		}
		insert(attempt(e, "billing", 1, OutcomeRetry))
		step(e.ID, StatusRetrying)
		insert(attempt(e, "billing", 2, OutcomeSuccess))
		step(e.ID, StatusSent)
		insert(attempt(e, "shipping", 1, OutcomeSuccess))
		step(e.ID, StatusConsumed)
		d := mustGet(t, s, e.ID)
		want := map[string]AttemptMark{
			"billing":  {AttemptNo: 2, Success: true, Outcome: OutcomeSuccess},
			"shipping": {AttemptNo: 1, Success: true, Outcome: OutcomeSuccess},
		}
		for c, m := range want {
			if got := d.Event.Latest[c]; !got.sameAttempt(m) || got.ConsumedAt.IsZero() {
				t.Errorf("latest[%s] = %+v, want %+v with when it was consumed", c, d.Event.Latest[c], m)
			}
		}
	})

	t.Run("more attempts than the window", func(t *testing.T) {
		e := newEventOn(t, orderTopic, "order.purchased", clock.t)
		if err := s.RecordSent(ctx, SentAt(clock.t, e)); err != nil {
			t.Fatal(err)
		}
		insert(attempt(e, "shipping", 1, OutcomeSuccess))
		for n := 1; n <= attemptWindow+3; n++ {
			insert(attempt(e, "billing", n, OutcomeRetry))
		}
		step(e.ID, StatusPartial)
		insert(attempt(e, "billing", attemptWindow+4, OutcomeSuccess))
		step(e.ID, StatusConsumed)
	})

	t.Run("a gap wider than the window is the reconciler's", func(t *testing.T) {
		e := newEventOn(t, orderTopic, "order.purchased", clock.t)
		if err := s.RecordSent(ctx, SentAt(clock.t, e)); err != nil {
			t.Fatal(err)
		}
		insert(attempt(e, "shipping", 1, OutcomeSuccess), attempt(e, "billing", attemptWindow+2, OutcomeSuccess))
		step(e.ID, StatusSent) // billing's attempt is past the window
		clock.t = clock.t.Add(2 * time.Minute)
		if _, err := s.Reconcile(ctx, 0); err != nil {
			t.Fatal(err)
		}
		if d := mustGet(t, s, e.ID); d.Event.Status != StatusConsumed {
			t.Fatalf("after the reconciler: %s, want CONSUMED", d.Event.Status)
		}
	})
}
