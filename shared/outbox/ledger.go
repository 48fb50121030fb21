package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/relaybus/relaybus/shared/postgres"
)

var (
	ledgerClaimSQL    = query("ledger_claim")
	ledgerRecordedSQL = query("ledger_recorded")
)

// Unrecorded is one aggregate whose sends the ledger may be missing: its
// published rows above the ledger's cursor.
type Unrecorded struct {
	Aggregate
	// From is the ledger's cursor; Rows are the published versions above
	// it, in order (at most the claim's limit); To is the last of them, or
	// From when there are none.
	From, To int64
	Rows     []Row
}

// Recorded says that the ledger holds the sends of an aggregate's versions
// above From up to To.
type Recorded struct {
	Aggregate
	From, To int64
}

// ClaimUnrecorded leases to the ledger's healing step up to aggregates
// aggregates whose sends the live recorder did not report recorded in
// time, for lease, with at most runLimit of each one's rows.
func ClaimUnrecorded(ctx context.Context, db postgres.DBTX, now time.Time, aggregates int, lease time.Duration, runLimit int) ([]Unrecorded, error) {
	rows, err := db.Query(ctx, ledgerClaimSQL, at(now), aggregates, lease.Seconds(), runLimit)
	if err != nil {
		return nil, fmt.Errorf("outbox: claim unrecorded sends: %w", err)
	}
	defer rows.Close()
	var out []Unrecorded
	for rows.Next() {
		var (
			u         Unrecorded
			published int64
			r         rowScan
		)
		if err := rows.Scan(append([]any{&u.Type, &u.ID, &u.From, &published}, r.dest()...)...); err != nil {
			return nil, fmt.Errorf("outbox: claim unrecorded sends: %w", err)
		}
		if n := len(out); n == 0 || out[n-1].Aggregate != u.Aggregate {
			u.To = u.From
			out = append(out, u)
		}
		last := &out[len(out)-1]
		if r.id == nil {
			last.To = max(last.From, published) // nothing (left) to record
			continue
		}
		row, err := r.row(u.Aggregate)
		if err != nil {
			return nil, err
		}
		last.Rows = append(last.Rows, row)
		last.To = row.Event.Version
	}
	return out, rows.Err()
}

// LedgerRecorded moves the ledger's cursor of each aggregate from From to
// To, where it still stands at From, in one statement. An aggregate that
// caught up with its published cursor leaves the healing queue; one still
// behind waits another healDelay.
func LedgerRecorded(ctx context.Context, db postgres.DBTX, now time.Time, healDelay time.Duration, rs []Recorded) error {
	if len(rs) == 0 {
		return nil
	}
	n := len(rs)
	types, ids, from, to := make([]string, n), make([]string, n), make([]int64, n), make([]int64, n)
	for i, r := range rs {
		types[i], ids[i], from[i], to[i] = r.Type, r.ID, r.From, r.To
	}
	if _, err := db.Exec(ctx, ledgerRecordedSQL, at(now), healDelay.Seconds(), types, ids, from, to); err != nil {
		return fmt.Errorf("outbox: ledger recorded: %w", err)
	}
	return nil
}

// Recorded is the cursor move that recording u's rows makes.
func (u Unrecorded) Recorded() Recorded {
	return Recorded{Aggregate: u.Aggregate, From: u.From, To: u.To}
}
