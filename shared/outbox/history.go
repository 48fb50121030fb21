package outbox

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"

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
	var n int
	if err := db.QueryRow(ctx, purgeSQL, o.Before, o.Limit, o.Ledger, topics, secs, max(o.History.Default, 0).Seconds()).Scan(&n); err != nil {
		return 0, fmt.Errorf("outbox: purge: %w", err)
	}
	if _, err := db.Exec(ctx, purgeDispatchSQL, o.Before, o.Limit); err != nil {
		return n, fmt.Errorf("outbox: purge dispatch: %w", err)
	}
	return n, nil
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
