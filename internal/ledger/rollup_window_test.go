package ledger

import (
	"context"
	"github.com/relaybus/relaybus/internal/ledger/model"
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
	step := func(e string, want model.Status) {
		t.Helper()
		r, err := s.Rollup(ctx, e)
		if err != nil {
			t.Fatal(err)
		}
		if r.Status != want {
			t.Fatalf("status %s, want %s", r.Status, want)
		}
	}
	insert := func(as ...model.Attempt) {
		t.Helper()
		if err := s.InsertAttempts(ctx, as); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("marks advance one attempt at a time", func(t *testing.T) {
		e := newEventOn(t, orderTopic, "order.purchased", clock.t)
		if err := s.RecordSent(ctx, model.SentAt(clock.t, e)); err != nil {
			t.Fatal(err)
		}
		insert(attempt(e, "billing", 1, model.OutcomeRetry))
		step(e.ID, model.StatusRetrying)
		insert(attempt(e, "billing", 2, model.OutcomeSuccess))
		step(e.ID, model.StatusSent)
		insert(attempt(e, "shipping", 1, model.OutcomeSuccess))
		step(e.ID, model.StatusConsumed)
		d := mustGet(t, s, e.ID)
		want := map[string]model.AttemptMark{
			"billing":  {AttemptNo: 2, Success: true, Outcome: model.OutcomeSuccess},
			"shipping": {AttemptNo: 1, Success: true, Outcome: model.OutcomeSuccess},
		}
		for c, m := range want {
			if got := d.Event.Latest[c]; !got.SameAttempt(m) || got.ConsumedAt.IsZero() {
				t.Errorf("latest[%s] = %+v, want %+v with when it was consumed", c, d.Event.Latest[c], m)
			}
		}
	})

	t.Run("more attempts than the window", func(t *testing.T) {
		e := newEventOn(t, orderTopic, "order.purchased", clock.t)
		if err := s.RecordSent(ctx, model.SentAt(clock.t, e)); err != nil {
			t.Fatal(err)
		}
		insert(attempt(e, "shipping", 1, model.OutcomeSuccess))
		for n := 1; n <= attemptWindow+3; n++ {
			insert(attempt(e, "billing", n, model.OutcomeRetry))
		}
		step(e.ID, model.StatusPartial)
		insert(attempt(e, "billing", attemptWindow+4, model.OutcomeSuccess))
		step(e.ID, model.StatusConsumed)
	})

	t.Run("a gap wider than the window is the reconciler's", func(t *testing.T) {
		e := newEventOn(t, orderTopic, "order.purchased", clock.t)
		if err := s.RecordSent(ctx, model.SentAt(clock.t, e)); err != nil {
			t.Fatal(err)
		}
		insert(attempt(e, "shipping", 1, model.OutcomeSuccess), attempt(e, "billing", attemptWindow+2, model.OutcomeSuccess))
		step(e.ID, model.StatusSent) // billing's attempt is past the window
		// The reconciler's first looks read the same windows (one request
		// for all the due events, not a query per event)...
		clock.t = clock.t.Add(2 * time.Minute)
		if _, err := s.Reconcile(ctx, 0); err != nil {
			t.Fatal(err)
		}
		if d := mustGet(t, s, e.ID); d.Event.Status != model.StatusSent {
			t.Fatalf("after the reconciler's first look: %s, want SENT (a window read)", d.Event.Status)
		}
		// ...and once the event has been open wholeReadAfter, it reads the
		// attempts whole.
		clock.t = clock.t.Add(wholeReadAfter * time.Minute)
		if _, err := s.Reconcile(ctx, 0); err != nil {
			t.Fatal(err)
		}
		if d := mustGet(t, s, e.ID); d.Event.Status != model.StatusConsumed {
			t.Fatalf("after the reconciler's look %v after the send: %s, want CONSUMED", wholeReadAfter*time.Minute+2*time.Minute, d.Event.Status)
		}
	})
}
