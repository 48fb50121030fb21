package inbox

import (
	"context"
	"fmt"

	"github.com/relaybus/relaybus/shared/postgres"
)

var appliedEventsSQL = query("applied")

// Applied returns which of eventIDs consumer has applied (its inbox holds
// them through a successful attempt; an event parked by a strict consumer
// is held, not applied), in db, normally the delivery's transaction.
func Applied(ctx context.Context, db postgres.DBTX, consumer string, eventIDs ...string) (map[string]bool, error) {
	out := map[string]bool{}
	if len(eventIDs) == 0 {
		return out, nil
	}
	rows, err := db.Query(ctx, appliedEventsSQL, consumer, eventIDs)
	if err != nil {
		return nil, fmt.Errorf("inbox: applied: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("inbox: applied: %w", err)
		}
		out[id] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("inbox: applied: %w", err)
	}
	return out, nil
}
