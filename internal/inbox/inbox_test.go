package inbox_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relaybus/relaybus/internal/eventually"
	"github.com/relaybus/relaybus/internal/inbox"
	"github.com/relaybus/relaybus/internal/migrate"
	"github.com/relaybus/relaybus/internal/pgpool"
	"github.com/relaybus/relaybus/internal/pgtest"
)

func attempt(event string, n int, outcome string) inbox.Attempt {
	return inbox.Attempt{ConsumerID: "c", EventID: event, AttemptNo: n, Outcome: outcome,
		ConsumedAt: time.Now().UTC().Truncate(time.Microsecond), Topic: "t", Subscription: "s", MessageID: "m"}
}

func migrated(t *testing.T) *pgxpool.Pool {
	t.Helper()
	db := pgtest.Schema(t)
	if err := inbox.Migrate(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	return db
}

func count(t *testing.T, db *pgxpool.Pool, q string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Numbers keep counting without a counter of their own: a failed attempt
// recorded after its rollback, the next attempt that applies the event, a
// duplicate (no number), and a replay after a final failure released the
// inbox row each take the next number after the highest used.
func TestAttemptNumbersFollowTheRecordedAttempts(t *testing.T) {
	ctx := context.Background()
	db := migrated(t)
	begin := func() inbox.Begun {
		t.Helper()
		tx, err := db.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck // committed below
		b, err := inbox.BeginApplied(ctx, tx, attempt("e1", 0, ""))
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		return b
	}
	// A failed first attempt: its transaction rolled back, then recorded.
	if n, err := inbox.Record(ctx, db, attempt("e1", 0, "retry")); err != nil || n != 1 {
		t.Fatalf("failed first attempt: %d, %v; want number 1", n, err)
	}
	if b := begin(); !b.Claimed || b.Attempt != 2 {
		t.Fatalf("the attempt after a failure: %+v, want claimed as number 2", b)
	}
	if b := begin(); b.Claimed || b.Applied != 2 {
		t.Fatalf("a duplicate: %+v, want not claimed, applied by 2", b)
	}
	// A parked event settled as a final failure releases the inbox row; a
	// replay then applies it as the next attempt.
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n, err := inbox.Next(ctx, tx, "c", "e1")
	if err != nil || n != 3 {
		t.Fatalf("next: %d, %v; want 3", n, err)
	}
	if m, err := inbox.Settle(ctx, tx, attempt("e1", n, "failed")); err != nil || m != 3 {
		t.Fatalf("settle: %d, %v", m, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if b := begin(); !b.Claimed || b.Attempt != 4 {
		t.Fatalf("a replay after the release: %+v, want claimed as number 4", b)
	}
	if got := count(t, db, `SELECT count(*) FROM relaybus_attempts WHERE event_id = 'e1'`); got != 4 {
		t.Fatalf("%d attempts recorded, want 4", got)
	}
	if got := count(t, db, `SELECT count(*) FROM relaybus_inbox_unshipped WHERE event_id = 'e1'`); got != 4 {
		t.Fatalf("%d attempts queued for the ledger, want 4", got)
	}
}

// A failed attempt recorded (number 0) while a concurrent attempt holds the
// number it computed, uncommitted, waits for it and then takes the next
// number: both attempts are recorded, under different numbers.
func TestRecordTakesTheNextNumberWhenAConcurrentAttemptTookIt(t *testing.T) {
	ctx := context.Background()
	db := migrated(t)
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // committed below
	b, err := inbox.BeginApplied(ctx, tx, attempt("e2", 0, ""))
	if err != nil || !b.Claimed || b.Attempt != 1 {
		t.Fatalf("begin: %+v, %v", b, err)
	}
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := inbox.Record(ctx, db, attempt("e2", 0, "retry"))
		done <- result{n, err}
	}()
	// The record waits on the uncommitted attempt 1.
	eventually.True(t, 10*time.Second, "the record waits on the uncommitted attempt", func() bool {
		return count(t, db, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%Record an attempt%'`) == 1
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.n != 2 {
		t.Fatalf("the failed attempt's record: %d, %v; want number 2", r.n, r.err)
	}
	if got := count(t, db, `SELECT count(*) FROM relaybus_attempts WHERE event_id = 'e2'`); got != 2 {
		t.Fatalf("%d attempts recorded, want 2", got)
	}
}

// An attempt that waited on another's inbox row while a failed attempt
// recorded itself under the number it took (from its snapshot) records
// nothing: BeginApplied answers ErrNumberTaken, and the caller rolls back
// and asks for a redelivery, which takes the next number.
func TestBeginAppliedWhoseNumberAFailedAttemptTookIsRefused(t *testing.T) {
	ctx := context.Background()
	db := migrated(t)
	// An attempt in progress holds the event's inbox row.
	holder, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx) //nolint:errcheck // rolled back below
	if _, err := holder.Exec(ctx, `INSERT INTO relaybus_inbox (consumer_id, event_id, attempt_no) VALUES ('c', 'e5', 1)`); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		tx, err := db.Begin(ctx)
		if err != nil {
			done <- err
			return
		}
		defer tx.Rollback(ctx) //nolint:errcheck // never committed
		_, err = inbox.BeginApplied(ctx, tx, attempt("e5", 0, ""))
		done <- err
	}()
	eventually.True(t, 10*time.Second, "the attempt waits on the inbox row", func() bool {
		return count(t, db, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%Begin an attempt that records itself%'`) == 1
	})
	// The holder fails: its attempt records itself as number 1, then its
	// transaction ends without the inbox row.
	if n, err := inbox.Record(ctx, db, attempt("e5", 1, "retry")); err != nil || n != 1 {
		t.Fatalf("the failed attempt's record: %d, %v", n, err)
	}
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, inbox.ErrNumberTaken) {
		t.Fatalf("BeginApplied: %v, want ErrNumberTaken", err)
	}
	if got := count(t, db, `SELECT count(*) FROM relaybus_attempts WHERE event_id = 'e5'`); got != 1 {
		t.Fatalf("%d attempts recorded, want the failed one only", got)
	}
}

// The ledger's queue: every recorded attempt is unshipped until Shipped,
// Unshipped returns only attempts older than its bound, and a purge keeps
// an old attempt the ledger does not have.
func TestUnshippedQueue(t *testing.T) {
	ctx := context.Background()
	db := migrated(t)
	for _, e := range []string{"e1", "e2", "e3"} {
		if _, err := inbox.Record(ctx, db, attempt(e, 0, "retry")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.Exec(ctx, `UPDATE relaybus_attempts SET consumed_at = now() - interval '9 days' WHERE event_id IN ('e1', 'e2')`); err != nil {
		t.Fatal(err)
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	as, err := inbox.Unshipped(ctx, tx, "", time.Now().Add(-time.Hour), 10)
	if err != nil || len(as) != 2 {
		t.Fatalf("unshipped: %v, %v; want e1 and e2", as, err)
	}
	if err := inbox.Shipped(ctx, tx, as[:1]); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	shipped := as[0].EventID
	if got := count(t, db, `SELECT count(*) FROM relaybus_inbox_unshipped`); got != 2 {
		t.Fatalf("%d queued after one was shipped, want 2", got)
	}
	n, err := inbox.Purge(ctx, db, time.Now().Add(-24*time.Hour), 100)
	if err != nil || n != 1 {
		t.Fatalf("purge: %d, %v; want the one old shipped attempt", n, err)
	}
	if got := count(t, db, `SELECT count(*) FROM relaybus_attempts WHERE event_id = $1`, shipped); got != 0 {
		t.Fatalf("the old shipped attempt is still there")
	}
	if got := count(t, db, `SELECT count(*) FROM relaybus_attempts`); got != 2 {
		t.Fatalf("%d attempts left, want the old unshipped one and the new one", got)
	}
}

// A database the previous migrations made upgrades: the attempts the
// ledger did not have are queued, the counters go, and numbering goes on
// from the recorded attempts.
func TestMigrationUpgradesAnExistingInbox(t *testing.T) {
	ctx := context.Background()
	db := pgtest.Schema(t)
	old := fstest.MapFS{}
	for _, f := range []string{"001_create_inbox.sql", "002_attempts.sql", "003_claims.sql"} {
		b, err := os.ReadFile(filepath.Join("migrations", f))
		if err != nil {
			t.Fatal(err)
		}
		old["migrations/"+f] = &fstest.MapFile{Data: b}
	}
	line, err := migrate.LoadFS("inbox", old, "migrations")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := line.Apply(ctx, db); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `
		INSERT INTO relaybus_inbox_attempts (consumer_id, event_id, attempts) VALUES ('c', 'e1', 2), ('c', 'e2', 1);
		INSERT INTO relaybus_inbox (consumer_id, event_id, attempt_no) VALUES ('c', 'e1', 2);
		INSERT INTO relaybus_attempts (consumer_id, event_id, attempt_no, outcome, consumed_at, shipped_at) VALUES
			('c', 'e1', 1, 'retry', now(), now()), ('c', 'e1', 2, 'success', now(), NULL),
			('c', 'e2', 1, 'retry', now(), NULL)`); err != nil {
		t.Fatal(err)
	}
	if err := inbox.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	if got := count(t, db, `SELECT count(*) FROM relaybus_inbox_unshipped`); got != 2 {
		t.Fatalf("%d attempts queued after the upgrade, want the 2 unshipped", got)
	}
	if got := count(t, db, `SELECT count(*) FROM pg_class WHERE relname = 'relaybus_inbox_attempts' AND relnamespace = current_schema()::regnamespace`); got != 0 {
		t.Fatal("the counter table is still there")
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // committed below
	b, err := inbox.BeginApplied(ctx, tx, attempt("e2", 0, ""))
	if err != nil || !b.Claimed || b.Attempt != 2 {
		t.Fatalf("the next attempt at e2 after the upgrade: %+v, %v; want claimed as number 2", b, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := inbox.Record(ctx, db, attempt("e1", 0, "failed")); err != nil || n != 3 {
		t.Fatalf("an attempt at e1 after the upgrade: %d, %v; want number 3", n, err)
	}
}

// The unshipped queue has no index (migration 006): Shipped deletes a
// queue row by the tuple id BeginApplied returned, only when the row there
// is the attempt's; an attempt without one by its key.
func TestShippedFindsQueueRowsByTupleID(t *testing.T) {
	ctx := context.Background()
	db := migrated(t)
	apply := func(event string) inbox.Attempt {
		t.Helper()
		tx, err := db.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck // committed below
		a := attempt(event, 0, "success")
		b, err := inbox.BeginApplied(ctx, tx, a)
		if err != nil || !b.Claimed || !b.Queued.Valid {
			t.Fatalf("begin %s: %+v, %v; want it claimed and queued", event, b, err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		a.AttemptNo, a.Queued = b.Attempt, b.Queued
		return a
	}
	e1, e2, e3 := apply("e1"), apply("e2"), apply("e3")
	if got := count(t, db, `SELECT count(*) FROM pg_indexes WHERE tablename = 'relaybus_inbox_unshipped'`); got != 0 {
		t.Fatalf("the queue has %d indexes, want none", got)
	}

	// A tuple id that holds another attempt's row deletes nothing.
	wrong := e1
	wrong.Queued = e2.Queued
	if err := inbox.Shipped(ctx, db, []inbox.Attempt{wrong}); err != nil {
		t.Fatal(err)
	}
	if got := count(t, db, `SELECT count(*) FROM relaybus_inbox_unshipped`); got != 3 {
		t.Fatalf("%d queued after a mismatched tuple id, want 3", got)
	}

	// By tuple id, and one by its key.
	e3.Queued.Valid = false
	if err := inbox.Shipped(ctx, db, []inbox.Attempt{e1, e3}); err != nil {
		t.Fatal(err)
	}
	var left []string
	rows, err := db.Query(ctx, `SELECT event_id FROM relaybus_inbox_unshipped ORDER BY event_id`)
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
	if len(left) != 1 || left[0] != "e2" {
		t.Fatalf("queued after shipping e1 (by tuple id) and e3 (by key): %v, want [e2]", left)
	}
}

// A delivery of an event whose other delivery claimed it and had not
// committed waits for it; once that one commits, the waiting one claims
// nothing and reports no error (the event is applied, its number unknown
// to the waiter), both when it runs in the caller's transaction and when
// BeginAppliedIn begins it, through a pool that sends the BEGIN with the
// statement and one that does not. Nothing of the waiter is recorded.
func TestBeginAppliedOfAnEventAConcurrentDeliveryAppliesClaimsNothing(t *testing.T) {
	ctx := context.Background()
	db := migrated(t)
	pipelined, err := pgpool.New(ctx, db.Config().Copy(), pgpool.RetryPolicy{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pipelined.Close)
	type beginner interface {
		Begin(ctx context.Context) (pgx.Tx, error)
	}
	for _, c := range []struct {
		name  string
		begin func(a inbox.Attempt) (pgx.Tx, inbox.Begun, error)
	}{
		{"BeginApplied", func(a inbox.Attempt) (pgx.Tx, inbox.Begun, error) {
			tx, err := db.Begin(ctx)
			if err != nil {
				return nil, inbox.Begun{}, err
			}
			b, err := inbox.BeginApplied(ctx, tx, a)
			return tx, b, err
		}},
		{"BeginAppliedIn", func(a inbox.Attempt) (pgx.Tx, inbox.Begun, error) {
			return inbox.BeginAppliedIn(ctx, beginner(db), a)
		}},
		{"BeginAppliedIn pipelined", func(a inbox.Attempt) (pgx.Tx, inbox.Begun, error) {
			return inbox.BeginAppliedIn(ctx, pipelined, a)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			event := "race-" + strings.ReplaceAll(c.name, " ", "-")
			first, err := db.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer first.Rollback(ctx) //nolint:errcheck // committed below
			b, err := inbox.BeginApplied(ctx, first, attempt(event, 0, ""))
			if err != nil || !b.Claimed || b.Attempt != 1 {
				t.Fatalf("the first delivery: %+v, %v; want claimed as number 1", b, err)
			}
			type result struct {
				b   inbox.Begun
				err error
			}
			done := make(chan result, 1)
			go func() {
				tx, b, err := c.begin(attempt(event, 0, ""))
				if tx != nil {
					_ = tx.Rollback(ctx)
				} else if err == nil {
					err = errors.New("no transaction and no error")
				}
				done <- result{b, err}
			}()
			eventually.True(t, 10*time.Second, "the second delivery waits on the first's inbox row", func() bool {
				return count(t, db, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%Begin an attempt that records itself%'`) == 1
			})
			if err := first.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			r := <-done
			if r.err != nil || r.b.Claimed || r.b.Applied != 0 {
				t.Fatalf("the second delivery: %+v, %v; want nothing claimed, no error", r.b, r.err)
			}
			if got := count(t, db, `SELECT count(*) FROM relaybus_attempts WHERE event_id = $1`, event); got != 1 {
				t.Fatalf("%d attempts recorded, want the first delivery's only", got)
			}
		})
	}
}
