package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/relay"
)

// The relay's retention moves the rows of a topic the topology keeps
// history for into the history, kept the topic's history_retention_days
// (90 by default), instead of deleting them.
func TestRetentionMovesRowsToTheTopicsHistory(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	fill(t, e.pool, 2, 2)
	r := e.relay(t, relay.Options{Retention: time.Hour})
	if _, err := r.Drain(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `UPDATE relaybus_outbox SET created_at = now() - interval '2 hours' WHERE aggregateid = $1`, aggKey(0)); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Enqueue(ctx, e.pool, ev(aggKey(1), 3)); err != nil {
		t.Fatal(err)
	}
	if sum, err := r.Drain(ctx, 5*time.Second); err != nil || sum.Purged != 2 {
		t.Fatalf("drain: %+v %v; want the 2 old rows taken", sum, err)
	}
	var n int
	var days float64
	if err := e.pool.QueryRow(ctx, `SELECT count(*), coalesce(round(extract(epoch FROM min(keep_until - archived_at)) / 86400), 0)
		FROM relaybus_outbox_history WHERE aggregateid = $1 AND topic = $2`, aggKey(0), topic).Scan(&n, &days); err != nil {
		t.Fatal(err)
	}
	if n != 2 || days != 90 {
		t.Errorf("history holds %d rows of %s kept %.0f days; want 2, 90", n, aggKey(0), days)
	}
}
