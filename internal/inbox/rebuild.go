package inbox

import (
	"context"
	"fmt"

	"github.com/relaybus/relaybus/shared/postgres"
)

var (
	rebuildTablesSQL = query("rebuildtables")
	rebuildCountSQL  = query("rebuildcount")
	rebuildClearSQL  = query("rebuildclear")
)

// ClearForRebuild deletes consumerID's inbox rows, so that the messages a
// subscription seek delivers again are applied instead of answered as
// duplicates; with dryRun it only counts them. It returns how many rows it
// deleted (or would). A database where the consumer never started (no
// inbox table) has nothing to clear. Run it in the transaction that clears
// the consumer's projection (projection.ClearForRebuild).
func ClearForRebuild(ctx context.Context, db postgres.DBTX, consumerID string, dryRun bool) (int64, error) {
	var exists bool
	if err := db.QueryRow(ctx, rebuildTablesSQL).Scan(&exists); err != nil {
		return 0, fmt.Errorf("inbox: rebuild: %w", err)
	}
	if !exists {
		return 0, nil
	}
	q := rebuildClearSQL
	if dryRun {
		q = rebuildCountSQL
	}
	var n int64
	if err := db.QueryRow(ctx, q, consumerID).Scan(&n); err != nil {
		return 0, fmt.Errorf("inbox: rebuild of %s: %w", consumerID, err)
	}
	return n, nil
}
