package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/relaybus/relaybus/shared/postgres"
)

var (
	repushClaimSQL  = query("repush_claim")
	repushSettleSQL = query("repush_settle")

	// Repush's statements.
	repushFindSQL             = query("repush_find")
	repushReinsertSQL         = query("repush_reinsert")
	repushReinsertDispatchSQL = query("repush_reinsert_dispatch")
	repushTargetSQL           = query("repush_target")
	repushClearFailedSQL      = query("repush_clear_failed")
	repushQueueSQL            = query("repush_queue")
)

// QueuedRepush is one re-push of a published event, leased to a relay.
type QueuedRepush struct {
	// ID identifies the re-push.
	ID int64
	// EventID is the event re-pushed; Found is false when retention deleted
	// its row after the re-push was queued (it cannot be published then).
	EventID string
	Found   bool
	// Row is the event, addressed to the re-push's target.
	Row Row
	// Attempts counts the failed publishes of this re-push so far.
	Attempts int
}

// ClaimRepushes leases up to limit due re-pushes for lease.
func ClaimRepushes(ctx context.Context, db postgres.DBTX, now time.Time, lease time.Duration, limit int) ([]QueuedRepush, error) {
	rows, err := db.Query(ctx, repushClaimSQL, at(now), lease.Seconds(), limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: claim re-pushes: %w", err)
	}
	defer rows.Close()
	var out []QueuedRepush
	for rows.Next() {
		var (
			q        QueuedRepush
			target   string
			agg      [2]*string
			r        rowScan
			rowCols  = r.dest()
			aggFirst = []any{&agg[0], &agg[1]}
		)
		// The row's columns come after its aggregate here.
		dest := append([]any{&q.ID, &q.EventID, &target, &q.Attempts, &q.Found}, aggFirst...)
		dest = append(dest, rowCols[1:]...) // event_type onwards; the id is the re-push's event id
		if err := rows.Scan(dest...); err != nil {
			return nil, fmt.Errorf("outbox: claim re-pushes: %w", err)
		}
		if q.Found {
			id := q.EventID
			r.id = &id
			row, err := r.row(Aggregate{Type: *agg[0], ID: *agg[1]})
			if err != nil {
				return nil, err
			}
			row.Target = target
			q.Row = row
		}
		out = append(out, q)
	}
	return out, rows.Err()
}

// RepushOutcome is what happened to one leased re-push.
type RepushOutcome struct {
	ID        int64
	Published bool
	// Error, RetryAt and Final describe a failed publish: retried at
	// RetryAt, or FAILED for good when Final.
	Error   string
	RetryAt time.Time
	Final   bool
}

// SettleRepushes deletes the re-pushes Pub/Sub acknowledged and records the
// failures of the others, in one statement.
func SettleRepushes(ctx context.Context, db postgres.DBTX, now time.Time, outcomes []RepushOutcome) error {
	if len(outcomes) == 0 {
		return nil
	}
	n := len(outcomes)
	ids, pub, errs, retry, final := make([]int64, n), make([]bool, n), make([]string, n), make([]time.Time, n), make([]bool, n)
	for i, o := range outcomes {
		ids[i], pub[i], errs[i], retry[i], final[i] = o.ID, o.Published, o.Error, o.RetryAt, o.Final
		if retry[i].IsZero() {
			retry[i] = time.Now()
		}
	}
	if _, err := db.Exec(ctx, repushSettleSQL, at(now), ids, pub, errs, retry, final); err != nil {
		return fmt.Errorf("outbox: settle re-pushes: %w", err)
	}
	return nil
}
