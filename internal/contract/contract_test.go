package contract_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relaybus/relaybus/internal/contract"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/internal/schema"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/topology"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const topologyDoc = `
rollup: {topic: relaybus.ledger.rollup}
topics:
  - name: shop.order.events
    schemas:
      - {version: v1, type: protobuf, file: schemas/order.proto, message: shop.v1.Order}
    consumers: [{service: billing}]
  - name: shop.cart.events
    consumers: [{service: billing, enabled: false}]
`

const orderProto = `syntax = "proto3";
package shop.v1;
message Order { string id = 1; int64 cents = 2; }
`

// setup writes the topology and its schema file, and returns the contract
// and a migrated Postgres schema with a business table beside the outbox.
func setup(t *testing.T) (*contract.Contract, *pgxpool.Pool) {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "schemas"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "schemas", "order.proto"), []byte(orderProto), 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "topology.yaml")
	if err := os.WriteFile(path, []byte(topologyDoc), 0o644); err != nil {
		t.Fatal(err)
	}
	top, err := topology.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	c, err := contract.New(contract.Options{Topology: top})
	if err != nil {
		t.Fatal(err)
	}
	pool := pgtest.Schema(t)
	ctx := context.Background()
	if err := outbox.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	return c, pool
}

func order(id, topic, version, payload string) *event.Event {
	return &event.Event{ID: id, Type: "order.placed", Source: "order-service", Topic: topic,
		AggregateID: "o-" + id, Version: 1, SchemaVersion: version, Payload: []byte(payload)}
}

func rows(t *testing.T, pool *pgxpool.Pool, table string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM `+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestProducerRefusesWhatBreaksTheSchema: a payload that breaks its schema
// and a version the topic does not declare fail the call with a typed
// error naming the field, and nothing of the batch is written.
func TestProducerRefusesWhatBreaksTheSchema(t *testing.T) {
	c, pool := setup(t)
	p := &outbox.Producer{Contract: c}
	ctx := context.Background()
	cases := []struct {
		name      string
		bad       *event.Event
		wantField string
	}{
		{"payload breaks the schema", order("e2", "shop.order.events", "v1", `{"id": "o-2", "cents": "not a number"}`), "payload"},
		{"undeclared version", order("e2", "shop.order.events", "v2", `{"id": "o-2"}`), "schemaVersion"},
		{"binary payload on a json schema", func() *event.Event {
			e := order("e2", "shop.order.events", "v1", "\x0a\x01x")
			e.PayloadType = "application/protobuf"
			return e
		}(), "payloadType"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx) //nolint:errcheck
			_, err = p.Enqueue(ctx, tx, order("e1", "shop.order.events", "v1", `{"id": "o-1", "cents": "12"}`), tc.bad)
			var se *schema.Error
			if !errors.As(err, &se) || se.Field != tc.wantField {
				t.Fatalf("got %v, want a *schema.Error on %s", err, tc.wantField)
			}
			if !errors.Is(err, event.ErrInvalid) {
				t.Error("the error does not match event.ErrInvalid")
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if n := rows(t, pool, "relaybus_outbox"); n != 0 {
				t.Errorf("%d outbox rows written; a refused batch writes nothing", n)
			}
		})
	}
}

// TestProducerSkipsUnknownAndUnconsumedTopics: an event on a topic the
// topology does not declare, and one on a topic whose only consumer is
// disabled, are not written, logged at ERROR and reported SKIPPED; the
// call succeeds and the caller's own rows commit with the valid event.
func TestProducerSkipsUnknownAndUnconsumedTopics(t *testing.T) {
	c, pool := setup(t)
	var logs bytes.Buffer
	p := &outbox.Producer{Contract: c, Logger: slog.New(slog.NewJSONHandler(&logs, nil))}
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ('o-1')`); err != nil {
		t.Fatal(err)
	}
	res, err := p.Enqueue(ctx, tx,
		order("unknown", "shop.nobody.events", "v1", `{}`),
		order("ok", "shop.order.events", "v1", `{"id": "o-1"}`),
		order("unconsumed", "shop.cart.events", "v1", `{}`))
	if err != nil {
		t.Fatalf("the caller was failed: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	want := []outbox.State{outbox.StateSkipped, outbox.StatePending, outbox.StateSkipped}
	for i, r := range res {
		if r.State != want[i] {
			t.Errorf("result %d (%s): %s, want %s", i, r.ID, r.State, want[i])
		}
	}
	if !strings.Contains(res[0].Reason, "not declared") || !strings.Contains(res[2].Reason, "no enabled consumer") {
		t.Errorf("reasons: %q, %q", res[0].Reason, res[2].Reason)
	}
	if n := rows(t, pool, "orders"); n != 1 {
		t.Errorf("the caller's own row: %d, want 1 (its transaction goes on)", n)
	}
	var ids []string
	r, err := pool.Query(ctx, `SELECT id FROM relaybus_outbox ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	for r.Next() {
		var id string
		_ = r.Scan(&id)
		ids = append(ids, id)
	}
	if strings.Join(ids, ",") != "ok" {
		t.Errorf("outbox holds %v, want only the consumed topic's event", ids)
	}
	errorsLogged := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var l map[string]any
		if json.Unmarshal([]byte(line), &l) == nil && l["level"] == "ERROR" {
			errorsLogged[l["topic"].(string)] = true
		}
	}
	if !errorsLogged["shop.nobody.events"] || !errorsLogged["shop.cart.events"] || len(errorsLogged) != 2 {
		t.Errorf("ERROR logged for %v, want the two skipped topics:\n%s", errorsLogged, logs.String())
	}
}
