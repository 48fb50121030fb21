// Package inbox is the consumer side's deduplication and attempt log in
// Postgres: a row per (consumer, event) written in the same transaction as
// the handler's effect, so an event applied once is never applied again,
// however often Pub/Sub, Eventarc, a replay or a re-push delivers it; a
// counter that numbers each consumer's attempts at an event monotonically
// across redeliveries; and every attempt (relaybus_attempts) committed with
// its outcome, which makes Postgres the truth of what was consumed. The
// ledger (Firestore) gets the attempts after the fact: Unshipped and
// Shipped track which it has.
//
// An attempt runs in one transaction:
//
//	BEGIN
//	Begin       count the attempt, claim the event (or find it applied)
//	SAVEPOINT   (a pgx nested transaction)
//	handler     the consumer's effect and child events
//	Record      the successful attempt                     -> COMMIT
//	  or, when the handler failed:
//	ROLLBACK TO SAVEPOINT
//	Failed      release the claim, record the failed attempt -> COMMIT
//
// so the count, the claim, the effect and the attempt commit together, in
// one round trip each and a single commit.
//
// Every query is a .sql file under sql/, embedded.
package inbox

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relaybus/relaybus/shared/migrate"
	"github.com/relaybus/relaybus/shared/outbox"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Migrations is the inbox's migration line.
var Migrations = migrate.MustLoadFS("inbox", migrationFS, "migrations")

//go:embed sql/*.sql
var sqlFS embed.FS

func query(name string) string {
	b, err := sqlFS.ReadFile("sql/" + name + ".sql")
	if err != nil {
		panic("inbox: no query " + name)
	}
	return string(b)
}

var (
	beginSQL     = query("begin")
	recordSQL    = query("record")
	failedSQL    = query("failed")
	unshippedSQL = query("unshipped")
	shippedSQL   = query("shipped")
	purgeSQL     = query("purge")
)

// Migrate creates or upgrades the inbox tables in db's search_path.
func Migrate(ctx context.Context, db migrate.Beginner) error {
	_, err := Migrations.Apply(ctx, db)
	return err
}

// Begun is what Begin found.
type Begun struct {
	// Attempt is this attempt's number.
	Attempt int
	// Claimed is false when another delivery applied the event already (the
	// caller rolls back and acknowledges); Applied is then that delivery's
	// attempt number (0 when not known).
	Claimed bool
	Applied int
}

// Begin counts one more attempt of consumer at eventID and claims the
// event in the inbox, in tx (the attempt's transaction), in one statement.
// A concurrent delivery of the same event waits here until tx ends.
func Begin(ctx context.Context, tx outbox.DBTX, consumer, eventID string) (Begun, error) {
	var b Begun
	var applied *int
	if err := tx.QueryRow(ctx, beginSQL, consumer, eventID).Scan(&b.Attempt, &b.Claimed, &applied); err != nil {
		return Begun{}, fmt.Errorf("inbox: begin attempt: %w", err)
	}
	if !b.Claimed && applied != nil {
		b.Applied = *applied
	}
	return b, nil
}

// Attempt is one consumption attempt as Postgres records it.
type Attempt struct {
	ConsumerID string
	EventID    string
	// AttemptNo is the attempt's number; Record with 0 takes the next one.
	AttemptNo int
	// Outcome is the ledger's outcome name (success, retry, failed,
	// poison, dead_lettered).
	Outcome      string
	ErrorCode    string
	ErrorMessage string
	ConsumedAt   time.Time
	// The delivery's facts.
	Topic, Subscription, MessageID string
	DeliveryAttempt                int
}

func (a *Attempt) args() []any {
	return []any{a.ConsumerID, a.EventID, a.AttemptNo, a.Outcome, a.ErrorCode, a.ErrorMessage, a.ConsumedAt,
		a.Topic, a.Subscription, a.MessageID, a.DeliveryAttempt}
}

// Record writes an attempt through db (the attempt's transaction for a
// success, or the pool for an attempt outside any: then AttemptNo 0 takes
// the next number in the same statement). It returns the attempt's number,
// or 0 when that attempt was recorded already.
func Record(ctx context.Context, db outbox.DBTX, a Attempt) (int, error) {
	var n int
	err := db.QueryRow(ctx, recordSQL, a.args()...).Scan(&n)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("inbox: record attempt: %w", err)
	}
	return n, nil
}

// Failed releases the inbox claim of a failed attempt and records it, in
// tx after the handler's work was rolled back to the savepoint.
func Failed(ctx context.Context, tx outbox.DBTX, a Attempt) error {
	if _, err := tx.Exec(ctx, failedSQL, a.args()...); err != nil {
		return fmt.Errorf("inbox: record failed attempt: %w", err)
	}
	return nil
}

// Unshipped returns up to limit attempts the ledger does not have that
// were made before before, oldest first (of consumer, or of every consumer
// of the database when consumer is empty), locked in tx until it ends, so
// that two shipping steps never ship the same attempts.
func Unshipped(ctx context.Context, tx outbox.DBTX, consumer string, before time.Time, limit int) ([]Attempt, error) {
	rows, err := tx.Query(ctx, unshippedSQL, before, limit, consumer)
	if err != nil {
		return nil, fmt.Errorf("inbox: unshipped attempts: %w", err)
	}
	defer rows.Close()
	var out []Attempt
	for rows.Next() {
		var a Attempt
		if err := rows.Scan(&a.ConsumerID, &a.EventID, &a.AttemptNo, &a.Outcome, &a.ErrorCode, &a.ErrorMessage,
			&a.ConsumedAt, &a.Topic, &a.Subscription, &a.MessageID, &a.DeliveryAttempt); err != nil {
			return nil, fmt.Errorf("inbox: unshipped attempts: %w", err)
		}
		a.ConsumedAt = a.ConsumedAt.UTC()
		out = append(out, a)
	}
	return out, rows.Err()
}

// Shipped marks attempts as held by the ledger, in one statement.
func Shipped(ctx context.Context, db outbox.DBTX, as []Attempt) error {
	if len(as) == 0 {
		return nil
	}
	cs, es, ns := make([]string, len(as)), make([]string, len(as)), make([]int32, len(as))
	for i, a := range as {
		cs[i], es[i], ns[i] = a.ConsumerID, a.EventID, int32(a.AttemptNo)
	}
	if _, err := db.Exec(ctx, shippedSQL, cs, es, ns); err != nil {
		return fmt.Errorf("inbox: mark attempts shipped: %w", err)
	}
	return nil
}

// Purge deletes up to limit rows older than before from each of the inbox,
// the attempt counters and the attempts the ledger has (keep them longer
// than the subscription's message retention, so a redelivery still finds
// its inbox row) and returns how many rows it deleted in all.
func Purge(ctx context.Context, db outbox.DBTX, before time.Time, limit int) (int, error) {
	var a, b, c int
	if err := db.QueryRow(ctx, purgeSQL, before, limit).Scan(&a, &b, &c); err != nil {
		return 0, fmt.Errorf("inbox: purge: %w", err)
	}
	return a + b + c, nil
}
