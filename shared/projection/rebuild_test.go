package projection_test

import (
	"context"
	"testing"

	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/shared/projection"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// A rebuild's clear counts, then deletes, one consumer's projection state
// in scope (one aggregate type, or all) and nothing of another consumer's;
// a database where the consumer never started has nothing to clear.
func TestClearForRebuild(t *testing.T) {
	ctx := context.Background()
	db := pgtest.Schema(t)
	if n, err := projection.ClearForRebuild(ctx, db, "audit-service", "", true); err != nil || n != (projection.Cleared{}) {
		t.Fatalf("before any migration: %+v %v, want nothing and no error", n, err)
	}
	if err := projection.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`INSERT INTO relaybus_projection (consumer_id, aggregate_type, aggregate_id, version, event_id, event_type, state) VALUES
			('audit-service', 'member', 'm-1', 3, 'e1', 't', '{}'), ('audit-service', 'bonus', 'b-1', 1, 'e2', 't', '{}'),
			('other', 'member', 'm-1', 3, 'e1', 't', '{}')`,
		`INSERT INTO relaybus_strict_position (consumer_id, aggregate_type, aggregate_id, version, event_id) VALUES
			('audit-service', 'member', 'm-1', 3, 'e1'), ('other', 'member', 'm-1', 3, 'e1')`,
		`INSERT INTO relaybus_strict_parked (consumer_id, aggregate_type, aggregate_id, version, event_id, event, parked_at) VALUES
			('audit-service', 'member', 'm-1', 5, 'e5', '{}', now())`,
		`INSERT INTO relaybus_strict_skipped (consumer_id, aggregate_type, aggregate_id, version) VALUES
			('audit-service', 'bonus', 'b-1', 2)`,
	} {
		if _, err := db.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name    string
		aggType string
		dryRun  bool
		want    projection.Cleared
	}{
		{"dry run, one type", "bonus", true, projection.Cleared{Projection: 1, Skipped: 1}},
		{"dry run, all", "", true, projection.Cleared{Projection: 2, Positions: 1, Parked: 1, Skipped: 1}},
		{"clear one type", "bonus", false, projection.Cleared{Projection: 1, Skipped: 1}},
		{"what is left", "", true, projection.Cleared{Projection: 1, Positions: 1, Parked: 1}},
		{"clear all", "", false, projection.Cleared{Projection: 1, Positions: 1, Parked: 1}},
		{"nothing left", "", true, projection.Cleared{}},
	} {
		n, err := projection.ClearForRebuild(ctx, db, "audit-service", c.aggType, c.dryRun)
		if err != nil || n != c.want {
			t.Fatalf("%s: %+v %v, want %+v", c.name, n, err, c.want)
		}
	}
	var others int
	if err := db.QueryRow(ctx, `SELECT (SELECT count(*) FROM relaybus_projection WHERE consumer_id = 'other') + (SELECT count(*) FROM relaybus_strict_position WHERE consumer_id = 'other')`).Scan(&others); err != nil || others != 2 {
		t.Fatalf("the other consumer keeps %d rows (%v), want 2", others, err)
	}
}
