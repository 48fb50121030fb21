// Package inbox is the consumer side's deduplication in Postgres: a row per
// (consumer, event) written in the same transaction as the handler's
// effect, so an event applied once is never applied again, however often
// Pub/Sub, Eventarc, a replay or a re-push delivers it. It also numbers each
// consumer's attempts at an event, monotonically across redeliveries.
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

// Migrate creates or upgrades the inbox tables in db's search_path.
func Migrate(ctx context.Context, db migrate.Beginner) error {
	_, err := Migrations.Apply(ctx, db)
	return err
}

// NextAttempt counts one more attempt of consumer at eventID and returns
// its number (1 for the first). Call it outside the handler's transaction:
// the count must survive a rolled-back attempt.
func NextAttempt(ctx context.Context, db outbox.DBTX, consumer, eventID string) (int, error) {
	var n int
	err := db.QueryRow(ctx, `INSERT INTO relaybus_inbox_attempts (consumer_id, event_id, attempts) VALUES ($1, $2, 1)
		ON CONFLICT (consumer_id, event_id) DO UPDATE SET attempts = relaybus_inbox_attempts.attempts + 1, last_at = now()
		RETURNING attempts`, consumer, eventID).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("inbox: count attempt: %w", err)
	}
	return n, nil
}

// Processed reports whether consumer already applied eventID and, if so,
// with which attempt.
func Processed(ctx context.Context, db outbox.DBTX, consumer, eventID string) (attempt int, ok bool, err error) {
	err = db.QueryRow(ctx, `SELECT attempt_no FROM relaybus_inbox WHERE consumer_id = $1 AND event_id = $2`,
		consumer, eventID).Scan(&attempt)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("inbox: lookup: %w", err)
	}
	return attempt, true, nil
}

// Claim inserts (consumer, eventID) in tx, the handler's transaction. It
// returns false when the row is already there (a concurrent delivery
// committed first): the caller rolls back and acknowledges.
func Claim(ctx context.Context, tx outbox.DBTX, consumer, eventID string, attempt int) (bool, error) {
	tag, err := tx.Exec(ctx, `INSERT INTO relaybus_inbox (consumer_id, event_id, attempt_no) VALUES ($1, $2, $3)
		ON CONFLICT (consumer_id, event_id) DO NOTHING`, consumer, eventID, attempt)
	if err != nil {
		return false, fmt.Errorf("inbox: insert: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

// Purge deletes up to limit inbox and attempt rows older than before (keep
// them longer than the subscription's message retention, so a redelivery
// still finds them) and returns how many it deleted.
func Purge(ctx context.Context, db outbox.DBTX, before time.Time, limit int) (int, error) {
	var total int64
	for _, q := range []string{
		`DELETE FROM relaybus_inbox WHERE ctid = ANY(ARRAY(SELECT ctid FROM relaybus_inbox WHERE processed_at < $1 LIMIT $2))`,
		`DELETE FROM relaybus_inbox_attempts WHERE ctid = ANY(ARRAY(SELECT ctid FROM relaybus_inbox_attempts WHERE last_at < $1 LIMIT $2))`,
	} {
		tag, err := db.Exec(ctx, q, before, limit)
		if err != nil {
			return int(total), fmt.Errorf("inbox: purge: %w", err)
		}
		total += tag.RowsAffected()
	}
	return int(total), nil
}
