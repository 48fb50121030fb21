package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
)

// plainInsert writes e with a plain INSERT, as a producer without
// relaybus's Go code does (docs/producing.md, "Producing from any
// language").
func plainInsert(ctx context.Context, db interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, e *event.Event) error {
	_, err := db.Exec(ctx, `INSERT INTO relaybus_outbox (id, aggregatetype, aggregateid, event_type, version, payload,
		occurred_at, topic, source, schema_version, payload_type, trace_id, span_id, parent_event_id, correlation_id,
		source_version)
		VALUES ($1, $2, $3, $4, $5, $6, now(), $7, $8, $9, $10, $11, $12, $13, $14, nullif($15, ''))`,
		e.ID, e.AggregateType, e.AggregateID, e.Type, e.Version, e.Payload, e.Topic, e.Source, e.SchemaVersion,
		e.PayloadType, e.TraceID, e.SpanID, e.ParentEventID, e.CorrelationID, e.SourceVersion)
	return err
}

// goField is the outbox column of each field Validate names.
var goField = map[string]string{
	"eventId": "id", "eventType": "event_type", "source": "source", "topic": "topic", "aggregateType": "aggregatetype",
	"aggregateId": "aggregateid", "schemaVersion": "schema_version", "payloadType": "payload_type", "payload": "payload",
	"traceId": "trace_id", "spanId": "span_id", "parentEventId": "parent_event_id", "correlationId": "correlation_id",
	"sourceVersion": "source_version",
}

// A row written by plain SQL is checked against the rules Enqueue checks
// in Go: the trigger accepts exactly what Validate accepts, and refuses
// the rest with check_violation naming the event, the column and the
// rule.
func TestPlainSQLInsertIsCheckedByEnqueuesRules(t *testing.T) {
	ctx := context.Background()
	pool := newDB(t)
	long := func(n int, c string) string { return strings.Repeat(c, n) }
	cases := []struct {
		name string
		edit func(e *event.Event)
	}{
		{"valid", func(*event.Event) {}},
		{"id at its limit", func(e *event.Event) { e.ID = long(128, "a") }},
		{"id too long", func(e *event.Event) { e.ID = long(129, "a") }},
		{"id with a space", func(e *event.Event) { e.ID = "a b" }},
		{"id dot dot", func(e *event.Event) { e.ID = ".." }},
		{"id with a colon", func(e *event.Event) { e.ID = "urn:x:1" }},
		{"event type words", func(e *event.Event) { e.Type = "Order_Placed.v-2" }},
		{"event type empty word", func(e *event.Event) { e.Type = "order..purchased" }},
		{"event type too long", func(e *event.Event) { e.Type = long(129, "a") }},
		{"source with a slash", func(e *event.Event) { e.Source = "//shop/order-service" }},
		{"source with a space", func(e *event.Event) { e.Source = "order service" }},
		{"source empty", func(e *event.Event) { e.Source = "" }},
		{"source non-ASCII", func(e *event.Event) { e.Source = "commande-é" }},
		{"topic two segments", func(e *event.Event) { e.Topic = "shop.order" }},
		{"topic four segments", func(e *event.Event) { e.Topic = "a.b.c.d" }},
		{"topic upper case", func(e *event.Event) { e.Topic = "Shop.order.events" }},
		{"topic dlq segment", func(e *event.Event) { e.Topic = "shop.dlq.events" }},
		{"topic dead letters", func(e *event.Event) { e.Topic = "shop.order.events.dlq" }},
		{"topic segment starting with a digit", func(e *event.Event) { e.Topic = "shop.1order.events" }},
		{"aggregate type upper case", func(e *event.Event) { e.AggregateType = "Order" }},
		{"aggregate type at its limit", func(e *event.Event) { e.AggregateType = long(64, "o") }},
		{"aggregate type too long", func(e *event.Event) { e.AggregateType = long(65, "o") }},
		{"aggregate id at its limit", func(e *event.Event) { e.AggregateID = long(256, "A") }},
		{"aggregate id too long", func(e *event.Event) { e.AggregateID = long(257, "A") }},
		{"aggregate id with a dot", func(e *event.Event) { e.AggregateID = "a.b" }},
		{"schema version v12", func(e *event.Event) { e.SchemaVersion = "v12" }},
		{"schema version 1", func(e *event.Event) { e.SchemaVersion = "1" }},
		{"schema version v", func(e *event.Event) { e.SchemaVersion = "v" }},
		{"payload type with parameters", func(e *event.Event) { e.PayloadType = "application/json; charset=utf-8" }},
		{"payload type cloudevents json", func(e *event.Event) { e.PayloadType = "application/cloudevents+json" }},
		{"payload type text", func(e *event.Event) { e.PayloadType = "text/plain"; e.Payload = []byte("not json") }},
		{"payload not JSON", func(e *event.Event) { e.Payload = []byte(`{"n":`) }},
		{"payload JSON array", func(e *event.Event) { e.Payload = []byte(`[1,2]`) }},
		// Migration 013: 32 MiB whatever the payload type (a claim check
		// carries what a message cannot).
		{"payload over the broker's limit", func(e *event.Event) {
			e.Payload = []byte(`"` + long(event.MaxPayloadLimit, "a") + `"`)
		}},
		{"payload not JSON over its old limit", func(e *event.Event) {
			e.PayloadType, e.Payload = "application/octet-stream", make([]byte, event.MaxBinaryPayload+1)
		}},
		{"payload over the limit", func(e *event.Event) {
			e.Payload = []byte(`"` + long(event.MaxClaimCheckPayload-1, "a") + `"`)
		}},
		{"trace id", func(e *event.Event) { e.TraceID = "4bf92f3577b34da6a3ce929d0e0e4736" }},
		{"trace id with a slash", func(e *event.Event) { e.TraceID = "a/b" }},
		{"correlation id with a space", func(e *event.Event) { e.CorrelationID = "a b" }},
		{"parent event id", func(e *event.Event) { e.ParentEventID = "parent-1" }},
		{"source version", func(e *event.Event) { e.SourceVersion = "order-service-00042-kiq" }},
		{"source version with a plus", func(e *event.Event) { e.SourceVersion = "1.4.2+build5" }},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := ev(fmt.Sprintf("plain-%d", i), fmt.Sprintf("A-%d", i), 1)
			e.OccurredAt = time.Now()
			e.Normalize()
			c.edit(e)
			var want string // "" valid, else the columns Validate names
			var cols []string
			for _, fe := range event.FieldErrors(e.Validate(event.Limits{MaxPayloadBytes: event.MaxClaimCheckPayload, ClaimCheck: true})) {
				col, ok := goField[fe.Field]
				if !ok {
					t.Fatalf("Validate names %s, which no column holds", fe.Field)
				}
				cols = append(cols, col)
			}
			if len(cols) > 0 {
				want = strings.Join(cols, ",")
			}
			err := plainInsert(ctx, pool, e)
			var pe *pgconn.PgError
			switch {
			case want == "" && err != nil:
				t.Fatalf("Validate accepts it; the insert failed: %v", err)
			case want == "":
				var due bool
				if err := pool.QueryRow(ctx, `SELECT due_at IS NOT NULL FROM relaybus_outbox_dispatch WHERE aggregatetype = $1 AND aggregateid = $2`,
					e.AggregateType, e.AggregateID).Scan(&due); err != nil || !due {
					t.Fatalf("inserted, but its aggregate is not due: %v", err)
				}
			case !errors.As(err, &pe):
				t.Fatalf("Validate refuses it (%s); the insert: %v", want, err)
			case pe.Code != "23514" || !strings.Contains(","+want+",", ","+pe.ColumnName+",") ||
				!strings.Contains(pe.Message, "event "+e.ID+": "+pe.ColumnName+": "):
				t.Fatalf("Validate refuses it (%s); the insert failed with %s column %q: %s", want, pe.Code, pe.ColumnName, pe.Message)
			}
		})
	}
}

// The defaults fill what Enqueue fills when the producer leaves it out;
// a statement writing several aggregates makes each due once.
func TestPlainSQLInsertGetsEnqueuesDefaults(t *testing.T) {
	ctx := context.Background()
	pool := newDB(t)
	if _, err := pool.Exec(ctx, `INSERT INTO relaybus_outbox (aggregatetype, aggregateid, event_type, version, payload, topic, source)
		VALUES ('order', 'o-1', 'order.purchased', 1, convert_to('{"n":1}', 'UTF8'), 'shop.order.events', 'billing'),
		       ('order', 'o-1', 'order.purchased', 2, convert_to('{"n":2}', 'UTF8'), 'shop.order.events', 'billing'),
		       ('order', 'o-2', 'order.purchased', 1, convert_to('{"n":3}', 'UTF8'), 'shop.order.events', 'billing')`); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `SELECT id, trace_id, schema_version, payload_type, occurred_at IS NOT NULL FROM relaybus_outbox ORDER BY aggregateid, version`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id, trace, sv, pt string
		var at bool
		if err := rows.Scan(&id, &trace, &sv, &pt, &at); err != nil {
			t.Fatal(err)
		}
		e := ev(id, "o-1", 1)
		e.TraceID, e.OccurredAt = trace, time.Now()
		e.Normalize()
		if err := e.Validate(event.Limits{}); err != nil || sv != "v1" || pt != event.DefaultPayloadType || !at || len(trace) != 32 {
			t.Errorf("defaults: id %q trace %q schema %q type %q: %v", id, trace, sv, pt, err)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	assertDispatch(t, pool, "o-1", 2, 0)
	assertDispatch(t, pool, "o-2", 1, 0)
}

// assertDispatch checks an aggregate's dispatch row is due with the given
// cursors.
func assertDispatch(t *testing.T, pool *pgxpool.Pool, agg string, enqueued, published int64) {
	t.Helper()
	var ev, pv int64
	var due bool
	err := pool.QueryRow(context.Background(), `SELECT enqueued_version, published_version, due_at IS NOT NULL
		FROM relaybus_outbox_dispatch WHERE aggregateid = $1`, agg).Scan(&ev, &pv, &due)
	if errors.Is(err, pgx.ErrNoRows) || err != nil || ev != enqueued || pv != published || !due {
		t.Fatalf("%s: dispatch enqueued %d published %d due %v (%v), want %d, %d, due", agg, ev, pv, due, err, enqueued, published)
	}
}

// Written by Go or by plain SQL, the same events leave the same dispatch
// state: a late version sends the cursor back, a FAILED aggregate stays
// blocked, a leased one keeps its lease.
func TestPlainSQLInsertMovesDispatchAsEnqueueDoes(t *testing.T) {
	ctx := context.Background()
	for _, via := range []string{"go", "sql"} {
		t.Run(via, func(t *testing.T) {
			pool := newDB(t)
			write := func(es ...*event.Event) {
				t.Helper()
				if via == "go" {
					if _, err := outbox.Enqueue(ctx, pool, es...); err != nil {
						t.Fatal(err)
					}
					return
				}
				for _, e := range es {
					e.Normalize()
					if err := plainInsert(ctx, pool, e); err != nil {
						t.Fatal(err)
					}
				}
			}
			write(ev("e1", "A", 1), ev("e2", "A", 2))
			assertDispatch(t, pool, "A", 2, 0)
			// Published through 2, then version 4, then the late 3.
			if _, err := pool.Exec(ctx, `UPDATE relaybus_outbox_dispatch SET published_version = 2, ledger_version = 2, due_at = NULL`); err != nil {
				t.Fatal(err)
			}
			write(ev("e4", "A", 4))
			assertDispatch(t, pool, "A", 4, 2)
			if _, err := pool.Exec(ctx, `UPDATE relaybus_outbox_dispatch SET published_version = 4, ledger_version = 4, due_at = NULL`); err != nil {
				t.Fatal(err)
			}
			write(ev("e3", "A", 3))
			assertDispatch(t, pool, "A", 4, 2)
			// FAILED at 5: a sixth version waits behind it, not due.
			if _, err := pool.Exec(ctx, `UPDATE relaybus_outbox_dispatch SET published_version = 4, failed_version = 5, failed_at = now(), due_at = NULL, enqueued_version = 5`); err != nil {
				t.Fatal(err)
			}
			write(ev("e6", "A", 6))
			var due bool
			var enq int64
			if err := pool.QueryRow(ctx, `SELECT due_at IS NOT NULL, enqueued_version FROM relaybus_outbox_dispatch WHERE aggregateid = 'A'`).Scan(&due, &enq); err != nil || due || enq != 6 {
				t.Fatalf("behind a FAILED version: due %v enqueued %d (%v)", due, enq, err)
			}
		})
	}
}

// The producer's version is kept with the event, whoever wrote it, and
// the relay's claim reads it back.
func TestSourceVersionIsKeptAndClaimed(t *testing.T) {
	ctx := context.Background()
	pool := newDB(t)
	e := ev("go-1", "A", 1)
	e.SourceVersion = "order-service-00042-kiq"
	if _, err := outbox.Enqueue(ctx, pool, e); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO relaybus_outbox (aggregatetype, aggregateid, event_type, version, payload, topic, source, source_version)
		VALUES ('order', 'B', 'order.purchased', 1, convert_to('{}', 'UTF8'), 'shop.order.events', 'billing', '2.0.1')`); err != nil {
		t.Fatal(err)
	}
	runs, err := outbox.Claim(ctx, pool, outbox.ClaimOptions{Owner: "t", Lease: time.Minute, Aggregates: 10, RunLimit: 10, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, r := range runs {
		for _, row := range r.Rows {
			got[row.Event.AggregateID] = row.Event.SourceVersion
		}
	}
	if got["A"] != "order-service-00042-kiq" || got["B"] != "2.0.1" {
		t.Fatalf("claimed source versions %v", got)
	}
}

// A plain insert may schedule its event as Enqueue does: deliver_at at
// most 30 days ahead makes its aggregate due then; further ahead is
// refused naming the column.
func TestPlainSQLInsertSchedulesWithDeliverAt(t *testing.T) {
	ctx := context.Background()
	pool := newDB(t)
	insert := func(agg string, ahead string) error {
		_, err := pool.Exec(ctx, `INSERT INTO relaybus_outbox (aggregatetype, aggregateid, event_type, version, payload, topic, source, deliver_at)
			VALUES ('order', $1, 'order.purchased', 1, convert_to('{}', 'UTF8'), 'shop.order.events', 'billing', now() + $2::interval)`, agg, ahead)
		return err
	}
	if err := insert("soon", "29 days"); err != nil {
		t.Fatal(err)
	}
	var dueInDays float64
	if err := pool.QueryRow(ctx, `SELECT extract(epoch FROM due_at - now()) / 86400 FROM relaybus_outbox_dispatch WHERE aggregateid = 'soon'`).Scan(&dueInDays); err != nil || dueInDays < 28.9 || dueInDays > 29.1 {
		t.Fatalf("scheduled 29 days ahead: due in %.2f days (%v)", dueInDays, err)
	}
	var pe *pgconn.PgError
	if err := insert("late", "31 days"); !errors.As(err, &pe) || pe.Code != "23514" || pe.ColumnName != "deliver_at" {
		t.Fatalf("scheduled 31 days ahead: %v", err)
	}
}
