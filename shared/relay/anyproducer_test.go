package relay_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/relay"
)

// plainInsert is the statement docs/producing.md gives producers that do
// not use relaybus's Go code ("Producing from any language"): one event,
// its payload a JSON text.
const plainInsert = `INSERT INTO relaybus_outbox (id, aggregatetype, aggregateid, event_type, version, payload,
    occurred_at, topic, source, schema_version, payload_type)
VALUES ($1, $2, $3, $4, $5, convert_to($6, 'UTF8'), now(), $7, $8, $9, 'application/json')`

// A producer in another language writes the outbox with a plain INSERT;
// the relay publishes those rows in version order together with the
// versions of the same aggregates enqueued through Go, one statement or
// many, whether the relay drains while they are written or after.
func TestPlainSQLInsertsArePublishedInOrderBetweenGoEnqueues(t *testing.T) {
	const aggregates, versions = 40, 12
	ctx := context.Background()
	doc, err := os.ReadFile("../../docs/producing.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), plainInsert) {
		t.Fatalf("docs/producing.md does not give the statement this test runs:\n%s", plainInsert)
	}
	e := newEnv(t)
	// Any driver: the simple query protocol, as psql or a driver without
	// prepared statements sends it, on a connection of its own.
	cfg := e.pool.Config().ConnConfig.Copy()
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	plain, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close(ctx)

	r := e.relay(t, relay.Options{BatchSize: 50, Aggregates: 10, RunLimit: 5})
	drained := make(chan error, 1)
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				drained <- nil
				return
			default:
			}
			if _, err := r.Drain(ctx, 5*time.Second); err != nil {
				drained <- err
				return
			}
		}
	}()
	for v := int64(1); v <= versions; v++ {
		switch v % 3 {
		case 0: // Go, one transaction for every aggregate's version v
			tx, err := e.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for a := range aggregates {
				if _, err := outbox.Enqueue(ctx, tx, ev(aggKey(a), v)); err != nil {
					t.Fatal(err)
				}
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		case 1: // plain SQL, one autocommit statement per event
			for a := range aggregates {
				if _, err := plain.Exec(ctx, plainInsert, fmt.Sprintf("%s-v%d", aggKey(a), v), "order", aggKey(a),
					"order.purchased", v, `{"n":1}`, topic, "billing-service", "v1"); err != nil {
					t.Fatalf("plain insert: %v", err)
				}
			}
		case 2: // plain SQL, one multi-row statement in a transaction
			tx, err := plain.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var b pgx.Batch
			for a := range aggregates {
				b.Queue(plainInsert, fmt.Sprintf("%s-v%d", aggKey(a), v), "order", aggKey(a),
					"order.purchased", v, `{"n":1}`, topic, "billing-service", "v1")
			}
			if err := tx.SendBatch(ctx, &b).Close(); err != nil {
				t.Fatalf("plain batch: %v", err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	close(stop)
	if err := <-drained; err != nil {
		t.Fatal(err)
	}
	waitDrained(t, r, e.pool)
	e.rec.checkExactlyInOrder(t, aggregates, versions)
}
