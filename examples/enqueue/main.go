// Command enqueue is the smallest producer: it writes an event to the
// outbox in its own transaction, beside the row the event describes, and
// leaves publishing to the relay. It is what a service links to produce
// (shared/outbox and pgx, with the OpenTelemetry API and no SDK, exporter
// or cloud client: internal/layering checks it).
//
//	DATABASE_URL=postgres://... go run ./examples/enqueue order-1
package main

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
)

func main() {
	if len(os.Args) != 2 {
		log.Fatal("usage: enqueue <order id> (with DATABASE_URL set)")
	}
	if err := run(context.Background(), os.Getenv("DATABASE_URL"), os.Args[1]); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, url, orderID string) error {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := outbox.Migrate(ctx, pool); err != nil { // idempotent
		return err
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	// Your own writes go here, in tx: the event exists if and only if they do.
	res, err := outbox.Enqueue(ctx, tx, &event.Event{
		Type: "order.purchased", Topic: "shop.order.events", Source: "order-service",
		AggregateType: "order", AggregateID: orderID, Version: 1,
		Payload: []byte(`{"orderId":"` + orderID + `"}`),
	})
	if err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	fmt.Printf("enqueued %s (duplicate: %v)\n", res[0].ID, res[0].Duplicate)
	return nil
}
