package inbox_test

import (
	"context"
	"testing"

	"github.com/relaybus/relaybus/internal/inbox"
	"github.com/relaybus/relaybus/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// A rebuild's clear counts, then deletes, one consumer's inbox rows and no
// other consumer's; before the consumer's first start there is no inbox
// and nothing to clear.
func TestClearForRebuild(t *testing.T) {
	ctx := context.Background()
	db := pgtest.Schema(t)
	if n, err := inbox.ClearForRebuild(ctx, db, "audit-service", true); err != nil || n != 0 {
		t.Fatalf("before any migration: %d %v, want 0 and no error", n, err)
	}
	if err := inbox.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO relaybus_inbox (consumer_id, event_id, attempt_no) VALUES
		('audit-service', 'e1', 1), ('audit-service', 'e2', 1), ('other', 'e1', 1)`); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		dryRun bool
		want   int64
	}{{"dry run", true, 2}, {"clear", false, 2}, {"nothing left", true, 0}} {
		if n, err := inbox.ClearForRebuild(ctx, db, "audit-service", c.dryRun); err != nil || n != c.want {
			t.Fatalf("%s: %d %v, want %d", c.name, n, err, c.want)
		}
	}
	var others int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM relaybus_inbox WHERE consumer_id = 'other'`).Scan(&others); err != nil || others != 1 {
		t.Fatalf("the other consumer keeps %d rows (%v), want 1", others, err)
	}
}
