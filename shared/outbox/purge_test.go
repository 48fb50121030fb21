package outbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/relaybus/relaybus/shared/outbox"
)

// The purge finds old outbox rows through the retention index, which is
// keyed by the hour of created_at (migration 010: an insert within the
// hour of its range's newest row leaves the range's summary as it is): the
// purge names the key, so the planner can take the index (with sequential
// scans off, a lookup the index cannot serve shows as one).
func TestPurgeFindsOldRowsThroughTheHourlyIndex(t *testing.T) {
	ctx := context.Background()
	pool := newDB(t)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SET LOCAL enable_seqscan = off`); err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query(ctx, "EXPLAIN "+outbox.PurgeSQL, time.Now().Add(-24*time.Hour), 100, true,
		[]string{}, []float64{}, 0.0, []string{})
	if err != nil {
		t.Fatal(err)
	}
	var plan strings.Builder
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan.WriteString(line + "\n")
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(plan.String(), "Bitmap Index Scan on relaybus_outbox_created_hour") {
		t.Errorf("the purge does not read relaybus_outbox_created_hour:\n%s", plan.String())
	}
	if strings.Contains(plan.String(), "Seq Scan on relaybus_outbox ") {
		t.Errorf("the purge scans the whole outbox:\n%s", plan.String())
	}
}
