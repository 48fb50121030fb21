package outbox

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relaybus/relaybus/internal/migrate"
	"github.com/relaybus/relaybus/shared/postgres"
)

// History is how long retention keeps the events it takes out of the
// outbox, in the outbox database's history (relaybus_outbox_history,
// migration 009), per topic. The zero value keeps no history: retention
// deletes published rows, as before history existed.
type History struct {
	// Topics is the retention of each topic named (0: none).
	Topics map[string]time.Duration
	// Default is the retention of every other topic (0: none).
	Default time.Duration
	// Keep rewrites what the history keeps of the payloads of the topics
	// it names (their privacy rule's history mode: the personal fields
	// redacted, or nothing). It is given a row's payload as produced and
	// returns what to keep in its place; the rows move and are rewritten
	// in one transaction, so the history never holds the payload as
	// produced. An error stops the purge, and the rows stay in the outbox.
	// Topics it does not name keep their payloads as produced.
	Keep map[string]func(payload []byte) ([]byte, error)
}

// longest is the longest retention History names.
func (h History) longest() time.Duration {
	l := h.Default
	for _, d := range h.Topics {
		l = max(l, d)
	}
	return l
}

// PurgeOptions configure PurgeWith.
type PurgeOptions struct {
	// Before: rows committed before it may go.
	Before time.Time
	// Limit bounds the rows one call takes (required, > 0).
	Limit int
	// Ledger: only rows the ledger has recorded may go.
	Ledger bool
	// History says which topics' rows move to the history, and for how
	// long (the zero value: none, every row is deleted).
	History History
}

// PurgeWith is Purge that moves the rows of topics keeping history to
// relaybus_outbox_history instead of deleting them, each kept until its
// topic's retention has passed (see EnsureHistoryPartitions, which it
// calls first, and PruneHistory). It returns how many outbox rows it took.
func PurgeWith(ctx context.Context, db postgres.DBTX, o PurgeOptions) (int, error) {
	if o.Limit <= 0 {
		return 0, fmt.Errorf("outbox: purge: Limit must be positive, got %d", o.Limit)
	}
	if l := o.History.longest(); l > 0 {
		if err := EnsureHistoryPartitions(ctx, db, time.Now(), l); err != nil {
			return 0, err
		}
	}
	topics := make([]string, 0, len(o.History.Topics))
	for t := range o.History.Topics {
		topics = append(topics, t)
	}
	sort.Strings(topics)
	secs := make([]float64, len(topics))
	for i, t := range topics {
		secs[i] = max(o.History.Topics[t], 0).Seconds()
	}
	keep := make([]string, 0, len(o.History.Keep))
	for t := range o.History.Keep {
		keep = append(keep, t)
	}
	sort.Strings(keep)
	var n int
	if len(keep) == 0 {
		var moved []string
		if err := db.QueryRow(ctx, purgeSQL, o.Before, o.Limit, o.Ledger, topics, secs, max(o.History.Default, 0).Seconds(), keep).Scan(&n, &moved); err != nil {
			return 0, fmt.Errorf("outbox: purge: %w", err)
		}
	} else if b, ok := db.(migrate.Beginner); !ok {
		return 0, fmt.Errorf("outbox: purge: History.Keep needs a database handle that can begin a transaction")
	} else if err := pgx.BeginFunc(ctx, b, func(tx pgx.Tx) error {
		var moved []string
		if err := tx.QueryRow(ctx, purgeSQL, o.Before, o.Limit, o.Ledger, topics, secs, max(o.History.Default, 0).Seconds(), keep).Scan(&n, &moved); err != nil {
			return fmt.Errorf("outbox: purge: %w", err)
		}
		return rewriteHistory(ctx, tx, moved, o.History.Keep)
	}); err != nil {
		return 0, err
	}
	if _, err := db.Exec(ctx, purgeDispatchSQL, o.Before, o.Limit); err != nil {
		return n, fmt.Errorf("outbox: purge dispatch: %w", err)
	}
	return n, nil
}

// rewriteHistory replaces the payloads of the history rows ids (just moved,
// in the caller's transaction) by what keep returns for their topic.
func rewriteHistory(ctx context.Context, tx postgres.DBTX, ids []string, keep map[string]func([]byte) ([]byte, error)) error {
	if len(ids) == 0 {
		return nil
	}
	rows, err := tx.Query(ctx, `SELECT id, topic, payload FROM relaybus_outbox_history WHERE id = ANY($1)`, ids)
	if err != nil {
		return fmt.Errorf("outbox: history payloads: %w", err)
	}
	var out [][]byte
	var outIDs []string
	for rows.Next() {
		var id, topic string
		var payload []byte
		if err := rows.Scan(&id, &topic, &payload); err != nil {
			rows.Close()
			return fmt.Errorf("outbox: history payloads: %w", err)
		}
		f := keep[topic]
		if f == nil {
			continue
		}
		kept, err := f(payload)
		if err != nil {
			rows.Close()
			return fmt.Errorf("outbox: history payload of %s (topic %s): %w", id, topic, err)
		}
		outIDs, out = append(outIDs, id), append(out, kept)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("outbox: history payloads: %w", err)
	}
	if _, err := tx.Exec(ctx, `UPDATE relaybus_outbox_history h SET payload = u.payload
        FROM unnest($1::text[], $2::bytea[]) AS u(id, payload) WHERE h.id = u.id`, outIDs, out); err != nil {
		return fmt.Errorf("outbox: rewrite history payloads: %w", err)
	}
	return nil
}

func monthOf(t time.Time) time.Time {
	t = t.UTC()
	return time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
}

// EnsureHistoryPartitions creates the history's monthly partitions (by the
// rows' keep_until) from now's month to the month of now + longest, those
// that do not exist yet, so that a row kept for up to longest finds its
// partition (and a day more, for the database's clock against ours). The
// database function it calls runs as the table's owner (migration 009).
func EnsureHistoryPartitions(ctx context.Context, db postgres.DBTX, now time.Time, longest time.Duration) error {
	if _, err := db.Exec(ctx, `SELECT count(*) FROM relaybus_outbox_history_partitions($1, $2, '-infinity')`,
		monthOf(now), monthOf(now.Add(longest+24*time.Hour))); err != nil {
		return fmt.Errorf("outbox: history partitions: %w", err)
	}
	return nil
}

// PruneHistory drops the history's partitions whose every row's keep_until
// has passed (their month ended before now) and returns their names. A row
// is thus kept at least its topic's retention, and at most a month longer.
func PruneHistory(ctx context.Context, db postgres.DBTX, now time.Time) ([]string, error) {
	rows, err := db.Query(ctx, `SELECT relaybus_outbox_history_partitions('infinity', '-infinity', $1)`, now)
	if err != nil {
		return nil, fmt.Errorf("outbox: prune history: %w", err)
	}
	dropped, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("outbox: prune history: %w", err)
	}
	return dropped, nil
}
