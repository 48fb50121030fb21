package outbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
)

// at schedules e at t.
func at(e *event.Event, t time.Time) *event.Event { e.DeliverAt = t; return e }

// runOf is the run of aggregate agg among runs (nil: not claimed).
func runOf(runs []outbox.Run, agg string) *outbox.Run {
	for i := range runs {
		if runs[i].ID == agg {
			return &runs[i]
		}
	}
	return nil
}

// settleAll settles every run as published whole (nothing for an empty run).
func settleAll(t *testing.T, pool *pgxpool.Pool, now time.Time, runs []outbox.Run) {
	t.Helper()
	var ps []outbox.Progress
	for _, r := range runs {
		p := outbox.Progress{Aggregate: r.Aggregate, Epoch: r.Epoch, From: r.From, To: r.From}
		if len(r.Rows) > 0 {
			p = published(r)
		}
		ps = append(ps, p)
	}
	if _, err := outbox.Settle(context.Background(), pool, outbox.SettleOptions{Now: now}, ps); err != nil {
		t.Fatal(err)
	}
}

// A scheduled version is not claimed before its time, and neither are the
// versions of its aggregate after it; another aggregate is not held. At
// its time the relay takes the run from it.
func TestScheduledVersionHoldsItsAggregateOnly(t *testing.T) {
	ctx := context.Background()
	pool := newDB(t)
	now := time.Now().UTC()
	due := now.Add(time.Hour)
	// A: v1 now, v2 at +1h, v3 now (enqueued after v2: it waits); B: v1 now.
	if _, err := outbox.Enqueue(ctx, pool, ev("a1", "A", 1), at(ev("a2", "A", 2), due)); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Enqueue(ctx, pool, ev("a3", "A", 3), ev("b1", "B", 1)); err != nil {
		t.Fatal(err)
	}
	now = time.Now().UTC() // after the enqueues: A and B are due
	runs := claim(t, pool, now, "r1")
	a, b := runOf(runs, "A"), runOf(runs, "B")
	if a == nil || versions(*a) != "[1]" || !a.HeldAt.Equal(due.Truncate(time.Microsecond)) {
		t.Fatalf("A's run before v2 is due: %+v", a)
	}
	if b == nil || versions(*b) != "[1]" {
		t.Fatalf("B's run: %+v", b)
	}
	settleAll(t, pool, now, runs)
	if c := cursor(t, pool, "A"); c != 1 {
		t.Fatalf("A's cursor = %d, want 1", c)
	}
	// Due at v2's time, not before.
	var dueAt time.Time
	if err := pool.QueryRow(ctx, `SELECT due_at FROM relaybus_outbox_dispatch WHERE aggregateid = 'A'`).Scan(&dueAt); err != nil {
		t.Fatal(err)
	}
	if !dueAt.Equal(due.Truncate(time.Microsecond)) {
		t.Fatalf("A due at %v, want %v", dueAt, due)
	}
	var state string
	if err := pool.QueryRow(ctx, `SELECT state FROM relaybus_outbox_backlog WHERE aggregateid = 'A'`).Scan(&state); err != nil || state != "scheduled" {
		t.Fatalf("the backlog view says A is %q (%v), want scheduled", state, err)
	}
	if runs := claim(t, pool, due.Add(-time.Second), "r1"); len(runs) != 0 {
		t.Fatalf("claimed a second before v2 is due: %+v", runs)
	}
	runs = claim(t, pool, due, "r1")
	if a := runOf(runs, "A"); a == nil || versions(*a) != "[2 3]" {
		t.Fatalf("A's run when v2 is due: %+v", runs)
	}
}

// A scheduled event on an idle aggregate makes it due at its time; a
// relay whose lease lapses (it crashed holding the aggregate) neither
// published it early nor lost it: the next claim after its time takes it.
func TestScheduledEventSurvivesALapsedLease(t *testing.T) {
	ctx := context.Background()
	pool := newDB(t)
	now := time.Now().UTC()
	due := now.Add(10 * time.Minute)
	if _, err := outbox.Enqueue(ctx, pool, at(ev("s1", "S", 1), due)); err != nil {
		t.Fatal(err)
	}
	if runs := claim(t, pool, now, "r1"); len(runs) != 0 {
		t.Fatalf("claimed before it is due: %+v", runs)
	}
	// A relay leases it the moment it is due, and dies (no settle).
	runs := claim(t, pool, due, "dead")
	if s := runOf(runs, "S"); s == nil || versions(*s) != "[1]" {
		t.Fatalf("at its time: %+v", runs)
	}
	if runs := claim(t, pool, due.Add(30*time.Second), "r2"); len(runs) != 0 {
		t.Fatalf("taken while the dead relay's lease holds: %+v", runs)
	}
	runs = claim(t, pool, due.Add(2*time.Minute), "r2")
	if s := runOf(runs, "S"); s == nil || versions(*s) != "[1]" {
		t.Fatalf("after the lease lapsed: %+v", runs)
	}
	settleAll(t, pool, due.Add(2*time.Minute), runs)
	got, err := outbox.Lookup(ctx, pool, "s1")
	if err != nil {
		t.Fatal(err)
	}
	if got["s1"].State != outbox.StatePublished || !got["s1"].DeliverAt.Equal(due.Truncate(time.Microsecond)) {
		t.Fatalf("lookup: %+v", got["s1"])
	}
}

// The fast path never leases a run with a version that is not due.
func TestEnqueueClaimDoesNotLeaseAScheduledEvent(t *testing.T) {
	ctx := context.Background()
	pool := newDB(t)
	now := time.Now().UTC()
	o := claimOpts("fast")
	o.Now = now
	_, runs, err := outbox.EnqueueClaim(ctx, pool, o, at(ev("f1", "F", 1), now.Add(time.Hour)), ev("g1", "G", 1))
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 1 || runs[0].ID != "G" {
		t.Fatalf("fast path leased %+v, want G alone", runs)
	}
	if runs := claim(t, pool, now, "r1"); len(runs) != 0 {
		t.Fatalf("F claimed before it is due: %+v", runs)
	}
	// A later version of F through the fast path waits too.
	_, runs, err = outbox.EnqueueClaim(ctx, pool, o, ev("f2", "F", 2))
	if err != nil || len(runs) != 0 {
		t.Fatalf("fast path leased F behind its scheduled head: %+v %v", runs, err)
	}
	runs = claim(t, pool, now.Add(time.Hour), "r1")
	if f := runOf(runs, "F"); f == nil || versions(*f) != "[1 2]" {
		t.Fatalf("at F's time: %+v", runs)
	}
}

// Cancel skips the head version: its aggregate's cursor moves past it,
// the versions after it flow, it is never claimed, and the rules refuse
// what cannot be cancelled.
func TestCancel(t *testing.T) {
	ctx := context.Background()
	pool := newDB(t)
	now := time.Now().UTC()
	later := now.Add(time.Hour)
	if _, err := outbox.Enqueue(ctx, pool, at(ev("c1", "C", 1), later), at(ev("c2", "C", 2), later.Add(time.Hour)), ev("c3", "C", 3),
		ev("n1", "N", 1), at(ev("p1", "P", 1), now.Add(-time.Second))); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		id   string
		want error
	}{
		{"nope", outbox.ErrNotFound},
		{"n1", outbox.ErrNotScheduled},
		{"p1", outbox.ErrAlreadyDue},
		{"c2", outbox.ErrNotHead},
	} {
		if _, err := outbox.Cancel(ctx, pool, tc.id, outbox.CancelOptions{}); !errors.Is(err, tc.want) {
			t.Errorf("Cancel(%s) = %v, want %v", tc.id, err, tc.want)
		}
	}
	got, err := outbox.Cancel(ctx, pool, "c1", outbox.CancelOptions{By: "ops@example.com", Reason: "order withdrawn"})
	if err != nil || got.State != outbox.StateCancelled {
		t.Fatalf("Cancel(c1) = %+v, %v", got, err)
	}
	if again, err := outbox.Cancel(ctx, pool, "c1", outbox.CancelOptions{}); err != nil || again.State != outbox.StateCancelled {
		t.Fatalf("Cancel(c1) again = %+v, %v", again, err)
	}
	if c := cursor(t, pool, "C"); c != 1 {
		t.Fatalf("C's cursor = %d, want 1 (past the cancelled version)", c)
	}
	// c2 is now the head, scheduled: held until its time, c3 behind it.
	runs := claim(t, pool, later.Add(time.Minute), "r1")
	if c := runOf(runs, "C"); c != nil {
		t.Fatalf("C claimed before c2 is due: %+v", c)
	}
	if _, err := outbox.Cancel(ctx, pool, "c2", outbox.CancelOptions{}); err != nil {
		t.Fatal(err)
	}
	runs = claim(t, pool, time.Now(), "r1")
	if c := runOf(runs, "C"); c == nil || versions(*c) != "[3]" {
		t.Fatalf("C after both cancels: %+v", runs)
	}
	st, err := outbox.Lookup(ctx, pool, "c1", "c2", "c3")
	if err != nil {
		t.Fatal(err)
	}
	if st["c1"].State != outbox.StateCancelled || st["c2"].State != outbox.StateCancelled || st["c3"].State != outbox.StatePending {
		t.Fatalf("states: %+v", st)
	}
	sched, err := outbox.Scheduled(ctx, pool, outbox.ScheduledOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(sched) != 1 || sched[0].ID != "p1" || !sched[0].Due {
		t.Fatalf("scheduled after the cancels: %+v", sched)
	}
}

// A cancelled version stays unpublished when a late version below it
// sends its aggregate's cursor back: the run is the late version and
// those after the cancelled one.
func TestACancelledVersionIsNotPublishedWhenTheCursorGoesBack(t *testing.T) {
	ctx := context.Background()
	pool := newDB(t)
	later := time.Now().UTC().Add(time.Hour)
	if _, err := outbox.Enqueue(ctx, pool, at(ev("l2", "L", 2), later), ev("l3", "L", 3)); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Cancel(ctx, pool, "l2", outbox.CancelOptions{}); err != nil {
		t.Fatal(err)
	}
	// The late first version: the cursor goes back below it.
	if _, err := outbox.Enqueue(ctx, pool, ev("l1", "L", 1)); err != nil {
		t.Fatal(err)
	}
	runs := claim(t, pool, time.Now(), "r1")
	if c := runOf(runs, "L"); c == nil || versions(*c) != "[1 3]" {
		t.Fatalf("L's run after the late version: %+v, want versions [1 3]", runs)
	}
	// Published, then past retention: the rows and the cancel record go.
	settleAll(t, pool, time.Now(), runs)
	n, err := outbox.Purge(ctx, pool, time.Now().Add(time.Minute), 100, false)
	if err != nil || n != 3 {
		t.Fatalf("purge deleted %d rows (%v), want 3", n, err)
	}
	var cancels int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM relaybus_outbox_cancelled`).Scan(&cancels); err != nil || cancels != 0 {
		t.Fatalf("%d cancel records left after their rows were purged (%v)", cancels, err)
	}
}

// Scheduled lists unpublished scheduled events by time, a page at a time.
func TestScheduledLists(t *testing.T) {
	ctx := context.Background()
	pool := newDB(t)
	now := time.Now().UTC()
	if _, err := outbox.Enqueue(ctx, pool, at(ev("x2", "X", 1), now.Add(2*time.Hour)), at(ev("y1", "Y", 1), now.Add(time.Hour)),
		ev("z1", "Z", 1)); err != nil {
		t.Fatal(err)
	}
	first, err := outbox.Scheduled(ctx, pool, outbox.ScheduledOptions{Limit: 1})
	if err != nil || len(first) != 1 || first[0].ID != "y1" || first[0].Due || first[0].Topic != "shop.order.events" {
		t.Fatalf("first page: %+v %v", first, err)
	}
	next, err := outbox.Scheduled(ctx, pool, outbox.ScheduledOptions{Limit: 5, After: first[0]})
	if err != nil || len(next) != 1 || next[0].ID != "x2" {
		t.Fatalf("next page: %+v %v", next, err)
	}
}

// Enqueue refuses a deliverAt too far ahead, naming the field and rule.
func TestEnqueueRefusesADeliverAtTooFarAhead(t *testing.T) {
	pool := newDB(t)
	_, err := outbox.Enqueue(context.Background(), pool, at(ev("far", "X", 1), time.Now().Add(event.MaxDeliverDelay+time.Hour)))
	var fe *event.FieldError
	if !errors.As(err, &fe) || fe.Field != "deliverAt" {
		t.Fatalf("err = %v, want a deliverAt field error", err)
	}
}
