package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/relaybus/relaybus/shared/postgres"
)

var (
	countSQL         = query("count")
	purgeSQL         = query("purge")
	purgeDispatchSQL = query("purge_dispatch")
	oldestSQL        = query("oldest")
)

// Oldest returns how long ago the oldest unpublished event was committed
// (by the database's clock), 0 when nothing waits: the age the
// relaybus.outbox.oldest_pending.age gauge reports.
func Oldest(ctx context.Context, db postgres.DBTX) (time.Duration, error) {
	var secs float64
	if err := db.QueryRow(ctx, oldestSQL).Scan(&secs); err != nil {
		return 0, fmt.Errorf("outbox: oldest: %w", err)
	}
	if secs < 0 {
		secs = 0
	}
	return time.Duration(secs * float64(time.Second)), nil
}

// Counts is the outbox's backlog.
type Counts struct {
	// Pending events wait to be published (due, leased, or retrying), and
	// Blocked ones wait behind a FAILED version of their aggregate.
	Pending int `json:"pending"`
	Blocked int `json:"blocked"`
	// Failed events gave up and wait for an operator (one per blocked
	// aggregate), plus FAILED re-pushes.
	Failed int `json:"failed"`
	// Aggregates with pending events, and how many of them a relay holds.
	Aggregates int `json:"aggregates"`
	Leased     int `json:"leased"`
	// Repushes are re-pushes of published events waiting to go out.
	Repushes int `json:"repushes"`
}

// Count returns the backlog (the sums of the relaybus_outbox_backlog view).
func Count(ctx context.Context, db postgres.DBTX) (Counts, error) {
	var c Counts
	var failedRepushes int
	err := db.QueryRow(ctx, countSQL).Scan(&c.Pending, &c.Failed, &c.Blocked, &c.Aggregates, &c.Leased, &c.Repushes, &failedRepushes)
	if err != nil {
		return Counts{}, fmt.Errorf("outbox: count: %w", err)
	}
	c.Pending += c.Repushes
	c.Failed += failedRepushes
	return c, nil
}

// Purge deletes up to limit rows committed before before that are
// published (and recorded by the ledger, when ledger is true), then up to
// limit dispatch rows of aggregates that have no row left and have been
// idle since before. It returns how many outbox rows it deleted; call it
// until that is less than limit. It keeps no history (PurgeWith does).
func Purge(ctx context.Context, db postgres.DBTX, before time.Time, limit int, ledger bool) (int, error) {
	return PurgeWith(ctx, db, PurgeOptions{Before: before, Limit: limit, Ledger: ledger})
}
