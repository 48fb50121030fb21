package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relaybus/relaybus/internal/eventually"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
)

func claimOpts(owner string) outbox.ClaimOptions {
	return outbox.ClaimOptions{Owner: owner, Lease: time.Minute, RunLimit: 3}
}

// lease reads an aggregate's lease: its owner ("" for none), epoch and
// whether it is due now.
func lease(t *testing.T, pool *pgxpool.Pool, agg string) (owner string, epoch int64, due bool) {
	t.Helper()
	var o *string
	err := pool.QueryRow(context.Background(), `SELECT lease_owner, epoch, coalesce(due_at <= now(), false)
		FROM relaybus_outbox_dispatch WHERE aggregateid = $1`, agg).Scan(&o, &epoch, &due)
	if err != nil {
		t.Fatal(err)
	}
	if o != nil {
		owner = *o
	}
	return owner, epoch, due
}

// The statement that writes the events leases each aggregate whose new
// versions are its only unpublished ones, and only those: the run it
// returns is what Claim would read back (rows in version order, times at
// the microsecond); an aggregate with a backlog, one another relay holds,
// a FAILED one, or more rows than the run limit is left due as Enqueue
// leaves it, for the drain or a claim of its own.
func TestEnqueueClaimLeasesOnlyWhatNothingIsInTheWayOf(t *testing.T) {
	ctx := context.Background()
	pool := newDB(t)
	// backlog: v1 unpublished; held: leased by another relay; failed:
	// FAILED at v1; idle: v1 published.
	if _, err := outbox.Enqueue(ctx, pool, ev("backlog-1", "backlog", 1), ev("held-1", "held", 1),
		ev("failed-1", "failed", 1), ev("idle-1", "idle", 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE relaybus_outbox_dispatch SET
		lease_owner = CASE aggregateid WHEN 'held' THEN 'other' END,
		lease_expires_at = CASE aggregateid WHEN 'held' THEN now() + interval '1 minute' END,
		due_at = CASE aggregateid WHEN 'held' THEN now() + interval '1 minute' WHEN 'backlog' THEN now() END,
		failed_version = CASE aggregateid WHEN 'failed' THEN 1 END,
		published_version = CASE aggregateid WHEN 'idle' THEN 1 ELSE 0 END`); err != nil {
		t.Fatal(err)
	}
	fresh2 := ev("fresh-2", "fresh", 2)
	fresh2.OccurredAt = time.Date(2026, 1, 2, 3, 4, 5, 123456789, time.FixedZone("x", 3600))
	events := []*event.Event{fresh2, ev("fresh-1", "fresh", 1), ev("backlog-2", "backlog", 2), ev("held-2", "held", 2),
		ev("failed-2", "failed", 2), ev("idle-2", "idle", 2),
		ev("long-1", "long", 1), ev("long-2", "long", 2), ev("long-3", "long", 3), ev("long-4", "long", 4)}
	enq, runs, err := outbox.EnqueueClaim(ctx, pool, claimOpts("fast"), events...)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range enq {
		if q.Duplicate || q.State != outbox.StatePending {
			t.Errorf("%s: %+v, want a new pending event", q.ID, q)
		}
	}
	got := map[string][]string{}
	for _, r := range runs {
		for _, row := range r.Rows {
			got[r.ID] = append(got[r.ID], row.Event.ID)
		}
	}
	if want := "map[fresh:[fresh-1 fresh-2] idle:[idle-2]]"; fmt.Sprint(got) != want {
		t.Fatalf("leased runs %v, want %s", got, want)
	}
	// The runs are what Claim reads: compare with a claim of the same
	// aggregates once the lease is handed back.
	byAgg := map[string]outbox.Run{}
	for _, r := range runs {
		byAgg[r.ID] = r
		owner, epoch, due := lease(t, pool, r.ID)
		if owner != "fast" || epoch != r.Epoch || due {
			t.Errorf("%s: lease owner %q epoch %d due %v; want fast's, epoch %d, not due until it expires", r.ID, owner, epoch, due, r.Epoch)
		}
	}
	if r := byAgg["idle"]; r.From != 1 || r.Epoch != 1 {
		t.Errorf("idle's run: from %d epoch %d, want from its cursor 1, epoch 1", r.From, r.Epoch)
	}
	if _, err := pool.Exec(ctx, `UPDATE relaybus_outbox_dispatch SET lease_owner = NULL, lease_expires_at = NULL, due_at = now()
		WHERE aggregateid IN ('fresh', 'idle')`); err != nil {
		t.Fatal(err)
	}
	read, err := outbox.Claim(ctx, pool, outbox.ClaimOptions{Owner: "check", Lease: time.Minute, Aggregates: 10, RunLimit: 10,
		Limit: 100, Events: []string{"fresh-1", "idle-2"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range read {
		mine := byAgg[r.ID]
		if fmt.Sprintf("%+v", r.Rows) != fmt.Sprintf("%+v", mine.Rows) {
			t.Errorf("%s: the statement's run\n%+v\nClaim reads\n%+v", r.ID, mine.Rows, r.Rows)
		}
		if r.From != mine.From || r.Attempts != mine.Attempts {
			t.Errorf("%s: from %d attempts %d, Claim reads %d %d", r.ID, mine.From, mine.Attempts, r.From, r.Attempts)
		}
	}
	// What was not leased is as Enqueue leaves it.
	for agg, want := range map[string]struct {
		owner string
		due   bool
	}{"backlog": {"", true}, "held": {"other", false}, "failed": {"", false}, "long": {"", true}} {
		owner, _, due := lease(t, pool, agg)
		if owner != want.owner || due != want.due {
			t.Errorf("%s: lease owner %q due %v, want %q due %v", agg, owner, due, want.owner, want.due)
		}
	}
}

// Idempotency and the all-or-nothing rule hold as for Enqueue: a repeat is
// a duplicate (nothing written, nothing leased), an id another event holds
// writes nothing of the call, and neither does a version conflict.
func TestEnqueueClaimKeepsEnqueuesGuarantees(t *testing.T) {
	ctx := context.Background()
	pool := newDB(t)
	if _, _, err := outbox.EnqueueClaim(ctx, pool, claimOpts("fast"), ev("e1", "A", 1)); err != nil {
		t.Fatal(err)
	}
	enq, runs, err := outbox.EnqueueClaim(ctx, pool, claimOpts("fast"), ev("e1", "A", 1))
	if err != nil || !enq[0].Duplicate || len(runs) != 0 {
		t.Fatalf("a repeat: %+v, runs %+v, %v; want a duplicate and no lease", enq, runs, err)
	}
	other := ev("e1", "A", 1)
	other.Payload = []byte(`{"n":2}`)
	_, _, err = outbox.EnqueueClaim(ctx, pool, claimOpts("fast"), ev("fresh", "B", 1), other)
	if !errors.Is(err, outbox.ErrEventIDConflict) {
		t.Fatalf("another event under e1: %v, want ErrEventIDConflict", err)
	}
	_, _, err = outbox.EnqueueClaim(ctx, pool, claimOpts("fast"), ev("fresh", "B", 1), ev("e9", "A", 1))
	if !errors.Is(err, outbox.ErrVersionConflict) {
		t.Fatalf("another event at A's version 1: %v, want ErrVersionConflict", err)
	}
	if n := count(t, pool); n != 1 {
		t.Fatalf("%d rows, want 1: a refused call wrote something", n)
	}
	var dispatch int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM relaybus_outbox_dispatch WHERE aggregateid = 'B'`).Scan(&dispatch)
	if dispatch != 0 {
		t.Fatal("a refused call left a dispatch row (a lease) for B")
	}
}

// An id another transaction commits while the statement runs (the
// statement's snapshot cannot see it, its insert skips it) is judged on
// what is then committed, and a clash writes nothing of the call: the
// statement fails on its own and runs again.
func TestEnqueueClaimJudgesAnIDCommittedWhileItRuns(t *testing.T) {
	ctx := context.Background()
	pool := newDB(t)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	theirs := ev("contested", "A", 1)
	theirs.Payload = []byte(`{"theirs":true}`)
	if _, err := outbox.Enqueue(ctx, tx, theirs); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, _, err := outbox.EnqueueClaim(ctx, pool, claimOpts("fast"), ev("beside", "B", 1), ev("contested", "A", 1))
		done <- err
	}()
	// The statement waits on the uncommitted row's id.
	eventually.True(t, 30*time.Second, "EnqueueClaim waits for the other transaction's row", func() bool {
		var waiting int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%EnqueueClaim%'`).Scan(&waiting)
		return waiting > 0
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, outbox.ErrEventIDConflict) {
		t.Fatalf("an id another event took meanwhile: %v, want ErrEventIDConflict", err)
	}
	var beside int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM relaybus_outbox WHERE id = 'beside'`).Scan(&beside)
	if beside != 0 {
		t.Fatal("the event beside the clash was written: the call was not all or nothing")
	}
}

// An event another transaction enqueued and had not committed when
// EnqueueClaim's statement began makes the statement wait for it; once it
// commits, EnqueueClaim answers the event as a duplicate, without an error
// and without a lease (the aggregate is due, as that Enqueue left it).
func TestEnqueueClaimOfAnEventAConcurrentTransactionCommitsIsADuplicate(t *testing.T) {
	ctx := context.Background()
	pool := newDB(t)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // committed below
	if _, err := outbox.Enqueue(ctx, tx, ev("race-1", "race", 1)); err != nil {
		t.Fatal(err)
	}
	type result struct {
		enq  []outbox.Enqueued
		runs []outbox.Run
		err  error
	}
	done := make(chan result, 1)
	go func() {
		enq, runs, err := outbox.EnqueueClaim(ctx, pool, claimOpts("fast"), ev("race-1", "race", 1))
		done <- result{enq, runs, err}
	}()
	eventually.True(t, 10*time.Second, "EnqueueClaim waits on the uncommitted event", func() bool {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%EnqueueClaim%'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || len(r.enq) != 1 || !r.enq[0].Duplicate || len(r.runs) != 0 {
		t.Fatalf("EnqueueClaim: %+v, %d runs, %v; want race-1 a duplicate, no run, no error", r.enq, len(r.runs), r.err)
	}
	if owner, _, due := lease(t, pool, "race"); owner != "" || !due {
		t.Fatalf("the aggregate: lease owner %q, due %v; want no lease, due", owner, due)
	}
}
