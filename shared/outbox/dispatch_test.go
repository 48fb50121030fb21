package outbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relaybus/relaybus/internal/eventually"
	"github.com/relaybus/relaybus/internal/migrate"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/shared/outbox"
)

func claim(t *testing.T, pool *pgxpool.Pool, now time.Time, owner string) []outbox.Run {
	t.Helper()
	runs, err := outbox.Claim(context.Background(), pool, outbox.ClaimOptions{Owner: owner, Lease: time.Minute,
		Aggregates: 100, RunLimit: 100, Limit: 1000, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	return runs
}

func versions(r outbox.Run) string {
	var vs []int64
	for _, row := range r.Rows {
		vs = append(vs, row.Event.Version)
	}
	return fmt.Sprint(vs)
}

// published is the progress of a run that Pub/Sub acknowledged whole.
func published(r outbox.Run) outbox.Progress {
	return outbox.Progress{Aggregate: r.Aggregate, Epoch: r.Epoch, From: r.From,
		To: r.Rows[len(r.Rows)-1].Event.Version, Rows: len(r.Rows)}
}

func cursor(t *testing.T, pool *pgxpool.Pool, agg string) int64 {
	t.Helper()
	var v int64
	if err := pool.QueryRow(context.Background(), `SELECT published_version FROM relaybus_outbox_dispatch WHERE aggregateid = $1`, agg).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// A claim leases an aggregate with its whole run; a second claim finds
// nothing until the lease expires; a settle under an old epoch (the lease
// was taken over) changes nothing.
func TestClaimLeasesRunsAndSettleIsFencedByEpoch(t *testing.T) {
	ctx := context.Background()
	pool := newDB(t)
	if _, err := outbox.Enqueue(ctx, pool, ev("a1", "A", 1), ev("a2", "A", 2), ev("b1", "B", 1)); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	first := claim(t, pool, now, "r1")
	if len(first) != 2 || versions(first[0]) != "[1 2]" && versions(first[1]) != "[1 2]" {
		t.Fatalf("claim: %+v", first)
	}
	if again := claim(t, pool, now, "r2"); len(again) != 0 {
		t.Fatalf("leased aggregates claimed again: %+v", again)
	}
	// The lease expires; r2 takes the aggregates over (a new epoch).
	second := claim(t, pool, now.Add(2*time.Minute), "r2")
	if len(second) != 2 {
		t.Fatalf("after the lease: %+v", second)
	}
	var ps []outbox.Progress
	for _, r := range first {
		ps = append(ps, published(r))
	}
	settled, err := outbox.Settle(ctx, pool, outbox.SettleOptions{}, ps)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range settled {
		if s.Moved {
			t.Errorf("the relay that lost its lease moved %v's cursor", s.Aggregate)
		}
	}
	if c := cursor(t, pool, "A"); c != 0 {
		t.Fatalf("cursor %d after a fenced settle, want 0", c)
	}
	ps = nil
	for _, r := range second {
		ps = append(ps, published(r))
	}
	settled, err = outbox.Settle(ctx, pool, outbox.SettleOptions{}, ps)
	if err != nil || len(settled) != 2 || !settled[0].Moved || !settled[1].Moved {
		t.Fatalf("the lease holder's settle: %+v %v", settled, err)
	}
	if c := cursor(t, pool, "A"); c != 2 {
		t.Errorf("cursor %d, want 2", c)
	}
	st, _ := outbox.Lookup(ctx, pool, "a1", "a2", "b1")
	for id, e := range st {
		if e.State != outbox.StatePublished {
			t.Errorf("%s: %s", id, e.State)
		}
	}
	if c, _ := outbox.Count(ctx, pool); c.Pending != 0 || c.Leased != 0 || c.Aggregates != 0 {
		t.Errorf("backlog %+v", c)
	}
}

// A version that commits inside a run after the run was read (a producer
// that wrote an older version late) keeps the cursor from jumping over it;
// one that commits below the cursor pulls it back. Either way the version
// is published, in order with what follows it.
func TestLateVersionsAreNeverSkipped(t *testing.T) {
	ctx := context.Background()
	pool := newDB(t)
	if _, err := outbox.Enqueue(ctx, pool, ev("a1", "A", 1), ev("a3", "A", 3)); err != nil {
		t.Fatal(err)
	}
	runs := claim(t, pool, time.Time{}, "r1")
	if versions(runs[0]) != "[1 3]" {
		t.Fatalf("run %s", versions(runs[0]))
	}
	// v2 commits while the run is on its way to Pub/Sub.
	if _, err := outbox.Enqueue(ctx, pool, ev("a2", "A", 2)); err != nil {
		t.Fatal(err)
	}
	settled, err := outbox.Settle(ctx, pool, outbox.SettleOptions{}, []outbox.Progress{published(runs[0])})
	if err != nil || len(settled) != 1 || settled[0].Moved {
		t.Fatalf("settle over a late version: %+v %v; want the cursor kept", settled, err)
	}
	if settled[0].Next != "a1" {
		t.Errorf("settle over a late version: next %q, want a1 (due again at once, for a relay settling in the background to kick)", settled[0].Next)
	}
	runs = claim(t, pool, time.Time{}, "r1")
	if len(runs) != 1 || versions(runs[0]) != "[1 2 3]" {
		t.Fatalf("the run again: %+v", runs)
	}
	if _, err := outbox.Settle(ctx, pool, outbox.SettleOptions{}, []outbox.Progress{published(runs[0])}); err != nil {
		t.Fatal(err)
	}
	// Below the cursor: v0 does not exist, so use a new aggregate whose v1
	// arrives after v2 and v3 were published.
	if _, err := outbox.Enqueue(ctx, pool, ev("b2", "B", 2), ev("b3", "B", 3)); err != nil {
		t.Fatal(err)
	}
	runs = claim(t, pool, time.Time{}, "r1")
	if _, err := outbox.Settle(ctx, pool, outbox.SettleOptions{}, []outbox.Progress{published(runs[0])}); err != nil {
		t.Fatal(err)
	}
	if c := cursor(t, pool, "B"); c != 3 {
		t.Fatalf("B's cursor %d, want 3", c)
	}
	if _, err := outbox.Enqueue(ctx, pool, ev("b1", "B", 1)); err != nil {
		t.Fatal(err)
	}
	if st, _ := outbox.Lookup(ctx, pool, "b1"); st["b1"].State != outbox.StatePending {
		t.Fatalf("a late v1: %+v", st)
	}
	runs = claim(t, pool, time.Time{}, "r1")
	if len(runs) != 1 || versions(runs[0]) != "[1 2 3]" {
		t.Fatalf("after a late v1: %+v; want it published, and what follows it again", runs)
	}
}

// Settling a batch does not wait for a producer that holds one of its
// aggregates in an open transaction: the others settle at once, that one
// when the producer commits.
func TestSettleDoesNotWaitOnOneProducer(t *testing.T) {
	ctx := context.Background()
	pool := newDB(t)
	if _, err := outbox.Enqueue(ctx, pool, ev("a1", "A", 1), ev("b1", "B", 1)); err != nil {
		t.Fatal(err)
	}
	runs := claim(t, pool, time.Time{}, "r1")
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Enqueue(ctx, tx, ev("a2", "A", 2)); err != nil { // holds A's dispatch row
		t.Fatal(err)
	}
	var ps []outbox.Progress
	for _, r := range runs {
		ps = append(ps, published(r))
	}
	type result struct {
		settled []outbox.Settled
		err     error
	}
	done := make(chan result, 1)
	go func() {
		settled, err := outbox.Settle(ctx, pool, outbox.SettleOptions{}, ps)
		done <- result{settled, err}
	}()
	// B's cursor moves while the producer still holds A's row.
	if !eventually.Within(10*time.Second, func() bool { return cursor(t, pool, "B") == 1 }) {
		_ = tx.Rollback(ctx)
		t.Fatal("B was not settled within 10 s while the producer held A")
	}
	if c := cursor(t, pool, "A"); c != 0 {
		t.Errorf("A's cursor %d while its producer's transaction is open, want 0", c)
	}
	select {
	case r := <-done:
		t.Fatalf("the settle returned while the producer held A: %+v %v", r.settled, r.err)
	default:
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || len(r.settled) != 2 || !r.settled[0].Moved || !r.settled[1].Moved {
		t.Fatalf("settle: %+v %v", r.settled, r.err)
	}
	if cursor(t, pool, "A") != 1 {
		t.Error("A not settled after the producer committed")
	}
	// A's v2 is due again.
	if runs := claim(t, pool, time.Time{}, "r1"); len(runs) != 1 || versions(runs[0]) != "[2]" {
		t.Errorf("after the settle: %+v", runs)
	}
}

// A failed publish schedules a retry of its aggregate (attempts counted),
// and the last allowed one makes it FAILED; the versions Pub/Sub took
// before the failure count as published.
func TestSettleRecordsFailures(t *testing.T) {
	ctx := context.Background()
	pool := newDB(t)
	if _, err := outbox.Enqueue(ctx, pool, ev("a1", "A", 1), ev("a2", "A", 2), ev("a3", "A", 3)); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	runs := claim(t, pool, now, "r1")
	p := outbox.Progress{Aggregate: runs[0].Aggregate, Epoch: runs[0].Epoch, From: 0, To: 1, Rows: 1,
		Failure: &outbox.Failure{Version: 2, Error: "permission denied", RetryAt: now.Add(time.Minute)}}
	if _, err := outbox.Settle(ctx, pool, outbox.SettleOptions{Now: now}, []outbox.Progress{p}); err != nil {
		t.Fatal(err)
	}
	st, _ := outbox.Lookup(ctx, pool, "a1", "a2")
	if st["a1"].State != outbox.StatePublished || st["a2"].State != outbox.StatePending || st["a2"].Attempts != 1 || st["a2"].LastError != "permission denied" {
		t.Fatalf("after a partial failure: %+v", st)
	}
	if runs := claim(t, pool, now.Add(30*time.Second), "r1"); len(runs) != 0 {
		t.Fatalf("claimed before its retry: %+v", runs)
	}
	runs = claim(t, pool, now.Add(time.Minute), "r1")
	if len(runs) != 1 || runs[0].Attempts != 1 || versions(runs[0]) != "[2 3]" {
		t.Fatalf("the retry: %+v", runs)
	}
	p = outbox.Progress{Aggregate: runs[0].Aggregate, Epoch: runs[0].Epoch, From: 1, To: 1,
		Failure: &outbox.Failure{Version: 2, Error: "still denied", Final: true}}
	if _, err := outbox.Settle(ctx, pool, outbox.SettleOptions{}, []outbox.Progress{p}); err != nil {
		t.Fatal(err)
	}
	st, _ = outbox.Lookup(ctx, pool, "a2", "a3")
	if st["a2"].State != outbox.StateFailed || st["a2"].Attempts != 2 || st["a3"].State != outbox.StatePending {
		t.Fatalf("after the final failure: %+v", st)
	}
	if runs := claim(t, pool, now.Add(time.Hour), "r1"); len(runs) != 0 {
		t.Errorf("a FAILED aggregate was claimed: %+v", runs)
	}
	var state string
	if err := pool.QueryRow(ctx, `SELECT state FROM relaybus_outbox_backlog WHERE aggregateid = 'A'`).Scan(&state); err != nil || state != "failed" {
		t.Errorf("the operators' view says %q (%v)", state, err)
	}
}

// An outbox of the per-row layout (migrations 1 and 2) upgrades: each
// aggregate's cursor stops below its lowest unpublished version, FAILED
// rows stay FAILED, sends the ledger missed are queued for healing, and
// the per-row columns are gone.
func TestUpgradeFromPerRowDispatch(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Schema(t)
	old := migrate.Line{Name: outbox.Migrations.Name, Migrations: outbox.Migrations.Migrations[:2]}
	if _, err := old.Apply(ctx, pool); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`INSERT INTO relaybus_outbox (id, aggregatetype, aggregateid, event_type, version, payload, occurred_at, topic, source, schema_version, payload_type, published_at)
		 VALUES ('a1','order','A','t',1,'',now(),'shop.order.events','s','v1','application/json', now()),
		        ('a2','order','A','t',2,'',now(),'shop.order.events','s','v1','application/json', NULL),
		        ('b1','order','B','t',1,'',now(),'shop.order.events','s','v1','application/json', NULL)`,
		`UPDATE relaybus_outbox SET failed_at = now(), attempts = 5, last_error = 'denied' WHERE id = 'b1'`,
		`UPDATE relaybus_outbox SET ledger_behind = true WHERE id = 'a1'`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if err := outbox.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	st, err := outbox.Lookup(ctx, pool, "a1", "a2", "b1")
	if err != nil {
		t.Fatal(err)
	}
	if st["a1"].State != outbox.StatePublished || st["a2"].State != outbox.StatePending || st["b1"].State != outbox.StateFailed || st["b1"].Attempts != 5 {
		t.Errorf("after the upgrade: %+v", st)
	}
	var ledgerVersion int64
	var ledgerDue *time.Time
	_ = pool.QueryRow(ctx, `SELECT ledger_version, ledger_due_at FROM relaybus_outbox_dispatch WHERE aggregateid = 'A'`).Scan(&ledgerVersion, &ledgerDue)
	if ledgerVersion != 0 || ledgerDue == nil {
		t.Errorf("A's ledger cursor %d, due %v; want 0 and queued for healing", ledgerVersion, ledgerDue)
	}
	var cols int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM information_schema.columns WHERE table_schema = current_schema()
		AND table_name = 'relaybus_outbox' AND column_name IN ('published_at', 'lease_owner', 'ledger_behind')`).Scan(&cols)
	if cols != 0 {
		t.Errorf("%d per-row dispatch columns left", cols)
	}
	if runs := claim(t, pool, time.Time{}, "r1"); len(runs) != 1 || versions(runs[0]) != "[2]" {
		t.Errorf("claim after the upgrade: %+v", runs)
	}
}

// A lease changes no indexed column of the dispatch row, so the claim's
// update is a heap-only tuple: no new entry in the primary key or the due
// index (docs/decisions/runs-not-rows.md, "Writes per event"). The backlog
// still shows the aggregate leased, its next attempt when the lease expires.
func TestClaimIsAHeapOnlyUpdate(t *testing.T) {
	ctx := context.Background()
	pool := newDB(t)
	if _, err := outbox.Enqueue(ctx, pool, ev("a1", "A", 1), ev("b1", "B", 1)); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	// The backend's counts not yet reported include its earlier
	// transactions' (it reports them when idle): count from here.
	counts := func() (updated, hot int64) {
		if err := tx.QueryRow(ctx, `SELECT pg_stat_get_xact_tuples_updated('relaybus_outbox_dispatch'::regclass),
			pg_stat_get_xact_tuples_hot_updated('relaybus_outbox_dispatch'::regclass)`).Scan(&updated, &hot); err != nil {
			t.Fatal(err)
		}
		return updated, hot
	}
	updated0, hot0 := counts()
	runs, err := outbox.Claim(ctx, tx, outbox.ClaimOptions{Owner: "r1", Lease: time.Minute, Aggregates: 10, RunLimit: 10, Limit: 100})
	if err != nil || len(runs) != 2 {
		t.Fatalf("claim: %+v %v", runs, err)
	}
	updated, hot := counts()
	updated, hot = updated-updated0, hot-hot0
	if updated != 2 || hot != 2 {
		t.Errorf("the claim updated %d dispatch rows, %d of them heap-only; want 2, both heap-only", updated, hot)
	}
	var state string
	var atExpiry bool
	if err := tx.QueryRow(ctx, `SELECT state, next_attempt_at = lease_expires_at FROM relaybus_outbox_backlog
		WHERE aggregateid = 'A'`).Scan(&state, &atExpiry); err != nil {
		t.Fatal(err)
	}
	if state != "leased" || !atExpiry {
		t.Errorf("backlog: state %s, next attempt at the lease's expiry %v; want leased, true", state, atExpiry)
	}
}

// A drain's claim on a database of many aggregates reads the due ones and
// their rows through indexes, not the whole dispatch table: 100,000
// aggregates, 500 due, and the claim of 64 fetches a few hundred blocks
// (a scan of the table alone is over 1,700).
func TestClaimReadsTheDueAggregatesNotTheTable(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 100,000 dispatch rows")
	}
	ctx := context.Background()
	pool := newDB(t)
	if _, err := pool.Exec(ctx, `
		INSERT INTO relaybus_outbox_dispatch (aggregatetype, aggregateid, enqueued_version, published_version,
			published_at, due_at, ledger_version)
		SELECT 'order', 'o' || g, CASE WHEN g <= 500 THEN 2 ELSE 1 END, 1, now(),
		       CASE WHEN g <= 500 THEN now() - make_interval(secs => g) END, 1
		FROM generate_series(1, 100000) g;
		INSERT INTO relaybus_outbox (id, aggregatetype, aggregateid, event_type, version, payload, occurred_at,
			topic, source, schema_version, payload_type)
		SELECT 'e' || g, 'order', 'o' || g, 't', 2, '\x00', now(), 'shop.order.events', 's', 'v1', 'application/octet-stream'
		FROM generate_series(1, 500) g;
		ANALYZE relaybus_outbox_dispatch;
		ANALYZE relaybus_outbox`); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	// The backend's counts not yet reported include its earlier
	// transactions' (it reports them when idle): count from here.
	fetched := func() (n int64) {
		if err := tx.QueryRow(ctx, `SELECT pg_stat_get_xact_blocks_fetched('relaybus_outbox_dispatch'::regclass)`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	blocks0 := fetched()
	runs, err := outbox.Claim(ctx, tx, outbox.ClaimOptions{Owner: "r1", Lease: time.Minute, Aggregates: 64, RunLimit: 10, Limit: 500})
	if err != nil || len(runs) != 64 {
		t.Fatalf("claim: %d runs, %v; want 64", len(runs), err)
	}
	blocks := fetched() - blocks0
	if blocks > 1000 {
		t.Errorf("the claim fetched %d blocks of the dispatch table; want a few hundred at most (its index and due rows, not a scan)", blocks)
	}
}

// The purge deletes the dispatch rows of aggregates idle since before its
// cutoff whose rows are all gone, and keeps those with something left to
// do: work due, a FAILED version, sends the ledger has still to record,
// rows still in the outbox, or a publish after the cutoff.
func TestPurgeDeletesOnlyIdleDispatchRows(t *testing.T) {
	ctx := context.Background()
	pool := newDB(t)
	if _, err := pool.Exec(ctx, `
		INSERT INTO relaybus_outbox_dispatch (aggregatetype, aggregateid, enqueued_version, published_version,
			published_at, due_at, failed_version, failed_at, ledger_version, ledger_due_at)
		VALUES ('order', 'idle', 2, 2, now() - interval '2 hours', NULL, NULL, NULL, 2, NULL),
		       ('order', 'due', 3, 2, now() - interval '2 hours', now(), NULL, NULL, 2, NULL),
		       ('order', 'failed', 3, 2, now() - interval '2 hours', NULL, 3, now(), 2, NULL),
		       ('order', 'owed', 2, 2, now() - interval '2 hours', NULL, NULL, NULL, 1, now()),
		       ('order', 'recent', 2, 2, now(), NULL, NULL, NULL, 2, NULL),
		       ('order', 'rows', 1, 1, now() - interval '2 hours', NULL, NULL, NULL, 1, NULL)`); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Enqueue(ctx, pool, ev("rows-1", "rows", 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE relaybus_outbox_dispatch SET due_at = NULL, published_version = 1, ledger_version = 1
		WHERE aggregateid = 'rows'`); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Purge(ctx, pool, time.Now().Add(-time.Hour), 100, true); err != nil {
		t.Fatal(err)
	}
	var left []string
	rows, err := pool.Query(ctx, `SELECT aggregateid FROM relaybus_outbox_dispatch ORDER BY aggregateid`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		left = append(left, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprint(left), "[due failed owed recent rows]"; got != want {
		t.Errorf("dispatch rows left %s, want %s (only idle's purged)", got, want)
	}
}
