package projection

import (
	"context"
	"errors"
	"fmt"

	"github.com/relaybus/relaybus/shared/postgres"
)

var (
	rebuildTablesSQL = query("rebuildtables")
	rebuildCountSQL  = query("rebuildcount")
	rebuildClearSQL  = query("rebuildclear")
)

// Cleared counts the state of a consumer a rebuild clears.
type Cleared struct {
	// Projection is latest-state rows (handler projection, and the strict
	// handler's own state).
	Projection int64 `json:"projectionRows"`
	// Positions, Parked and Skipped are the resequencer's (handler strict).
	Positions int64 `json:"strictPositions"`
	Parked    int64 `json:"strictParked"`
	Skipped   int64 `json:"strictSkipped"`
}

// ClearForRebuild deletes consumerID's projection state for aggregateType
// ("" for every type): latest-state rows, strict positions, parked and
// skipped versions, so that the versions a subscription seek delivers
// again pass the version gate; with dryRun it only counts them. A database
// where the consumer never started (no projection tables) has nothing to
// clear. Run it in one transaction with inbox.ClearForRebuild.
func ClearForRebuild(ctx context.Context, db postgres.DBTX, consumerID, aggregateType string, dryRun bool) (Cleared, error) {
	var n Cleared
	var first, second bool
	if err := db.QueryRow(ctx, rebuildTablesSQL).Scan(&first, &second); err != nil {
		return n, fmt.Errorf("projection: rebuild: %w", err)
	}
	switch {
	case !first:
		return n, nil
	case !second:
		return n, errors.New("projection: rebuild: the projection tables predate the resequencer's (relaybus_strict_skipped is missing): start the consumer once to migrate them")
	}
	q := rebuildClearSQL
	if dryRun {
		q = rebuildCountSQL
	}
	if err := db.QueryRow(ctx, q, consumerID, aggregateType).Scan(&n.Projection, &n.Positions, &n.Parked, &n.Skipped); err != nil {
		return n, fmt.Errorf("projection: rebuild of %s: %w", consumerID, err)
	}
	return n, nil
}
