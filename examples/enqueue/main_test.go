package main

import (
	"context"
	"errors"
	"testing"

	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/shared/outbox"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// The example does what its comment says: it creates the outbox, and the
// event it enqueues is in it, waiting for the relay; run again for the same
// order, the second event for version 1 of the order is refused and nothing
// is written.
func TestEnqueueWritesTheEventToTheOutbox(t *testing.T) {
	ctx := context.Background()
	pool, schema := pgtest.SchemaConfig(t, nil)
	url := pgtest.SchemaURL(t, schema)
	if err := run(ctx, url, "order-1"); err != nil {
		t.Fatal(err)
	}
	if err := run(ctx, url, "order-1"); !errors.Is(err, outbox.ErrVersionConflict) {
		t.Fatalf("enqueueing version 1 of order-1 again: %v, want outbox.ErrVersionConflict", err)
	}
	var n int
	var topic, aggregate string
	if err := pool.QueryRow(ctx, `SELECT count(*), min(topic), min(aggregateid) FROM relaybus_outbox`).Scan(&n, &topic, &aggregate); err != nil {
		t.Fatal(err)
	}
	if n != 1 || topic != "shop.order.events" || aggregate != "order-1" {
		t.Errorf("the outbox holds %d rows (topic %q, aggregate %q), want the one event for order-1 on shop.order.events", n, topic, aggregate)
	}
}
