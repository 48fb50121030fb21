package inbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/inbox"
)

// The purge finds old rows through the retention indexes, which are keyed
// by the hour (migration 006: an insert within the hour of a range's
// newest row leaves its summary as it is): both of its lookups name the
// key, so the planner can take the index (with sequential and plain index
// scans off, a lookup the index cannot serve shows as one of those).
func TestPurgeFindsOldRowsThroughTheHourlyIndexes(t *testing.T) {
	ctx := context.Background()
	db := migrated(t)
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	// Plain index scans off too: the anti-join with the unshipped queue
	// (which has no index, so its scan is sequential whatever the
	// settings) would otherwise walk the attempts' primary key.
	if _, err := tx.Exec(ctx, `SET LOCAL enable_seqscan = off; SET LOCAL enable_indexscan = off`); err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query(ctx, "EXPLAIN "+inbox.PurgeSQL, time.Now().Add(-24*time.Hour), 100)
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
	for _, index := range []string{"relaybus_inbox_processed_hour", "relaybus_attempts_consumed_hour"} {
		if !strings.Contains(plan.String(), "Bitmap Index Scan on "+index) {
			t.Errorf("the purge does not read %s:\n%s", index, plan.String())
		}
	}
	if strings.Contains(plan.String(), "Seq Scan on relaybus_inbox ") || strings.Contains(plan.String(), "Seq Scan on relaybus_attempts ") {
		t.Errorf("the purge scans a whole table:\n%s", plan.String())
	}
}
