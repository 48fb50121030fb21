package consume_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/cloudevent"
	"github.com/relaybus/relaybus/internal/contract"
	"github.com/relaybus/relaybus/internal/delivery"
	"github.com/relaybus/relaybus/internal/ledger/model"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/internal/schema"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/projection"
	"github.com/relaybus/relaybus/shared/topology"
)

// emitContract: member.points.events has a protobuf schema for v1,
// shop.cart.events a disabled consumer only.
func emitContract(t *testing.T) *contract.Contract {
	t.Helper()
	top, err := topology.Parse([]byte(`
rollup: {topic: relaybus.ledger.rollup}
topics:
  - name: shop.order.events
    consumers: [{service: member-service, emits: [member.points.events]}]
  - name: member.points.events
    schemas: [{version: v1, type: protobuf, file: points.proto, message: shop.v1.PointsAdded}]
    consumers: [{service: audit-service}]
  - name: shop.cart.events
    consumers: [{service: cart-service, enabled: false}]
`))
	if err != nil {
		t.Fatal(err)
	}
	set, err := schema.LoadFrom(top, func(string) ([]byte, error) {
		return []byte(`syntax = "proto3"; package shop.v1; message PointsAdded { string member_id = 1; int64 points = 2; }`), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	c, err := contract.New(contract.Options{Topology: top, Schemas: set})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func child(id, topic, version, payload string) *event.Event {
	return &event.Event{ID: id, Type: "points.added", Topic: topic, AggregateType: "member", AggregateID: "m-" + id,
		Version: 1, SchemaVersion: version, Payload: []byte(payload)}
}

// TestEmitChecksTheContract: a child that breaks its topic's schema, or
// names a version its topic does not declare, fails the attempt as a
// permanent error and nothing is emitted; children on an unknown topic and
// on a topic nobody consumes are skipped (ERROR logged, SKIPPED in
// EmitResults), and the delivery commits with the valid child.
func TestEmitChecksTheContract(t *testing.T) {
	ctr := emitContract(t)
	outboxRows := func(s *stack) int { return s.count(t, `SELECT count(*) FROM relaybus_outbox`) }

	for _, tc := range []struct {
		name  string
		child *event.Event
		rule  string
	}{
		{"payload breaks the schema", child("c1", "member.points.events", "v1", `{"memberId": "m-1", "points": "many"}`), "payload:"},
		{"undeclared version", child("c1", "member.points.events", "v2", `{"memberId": "m-1"}`), "schemaVersion:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := consumer.HandlerFunc(func(ctx context.Context, c *consumer.Context) error { return c.Emit(ctx, tc.child) })
			s := newStackWith(t, pgtest.Schema(t), h, "member-service", func(o *consumer.Options) { o.Contract = ctr })
			a := s.push(t, message(t, orderEvent("order-80", 1)), 1)
			if a.code != http.StatusOK || a.res.Outcome != model.OutcomeFailed || a.res.Code != "emit" {
				t.Fatalf("%+v, want 200 failed emit (permanent: no retry makes the child valid)", a)
			}
			if n := outboxRows(s); n != 0 {
				t.Errorf("%d children written", n)
			}
			if !strings.Contains(a.res.Error, tc.rule) {
				t.Errorf("the attempt's error %q does not name %q", a.res.Error, tc.rule)
			}
		})
	}

	// A child whose id another event already holds (here one on another
	// topic) is no duplicate: the attempt fails as a permanent error
	// naming the id, and nothing of the delivery's children is written.
	t.Run("an id another event holds", func(t *testing.T) {
		h := consumer.HandlerFunc(func(ctx context.Context, c *consumer.Context) error {
			return c.Emit(ctx, child("c-new", "member.points.events", "v1", `{"memberId": "m-2", "points": "1"}`),
				child("c-taken", "member.points.events", "v1", `{"memberId": "m-1", "points": "5"}`))
		})
		s := newStackWith(t, pgtest.Schema(t), h, "member-service", func(o *consumer.Options) { o.Contract = ctr })
		taken := child("c-taken", "shop.cart.events", "v1", `{}`)
		taken.AggregateType, taken.Type, taken.Source = "cart", "cart.emptied", "cart-service"
		if _, err := outbox.Enqueue(context.Background(), s.pool, taken); err != nil {
			t.Fatal(err)
		}
		a := s.push(t, message(t, orderEvent("order-82", 1)), 1)
		if a.code != http.StatusOK || a.res.Outcome != model.OutcomeFailed || a.res.Code != "emit" || !strings.Contains(a.res.Error, "c-taken") {
			t.Fatalf("%+v, want 200 failed emit naming c-taken (permanent: the id is another event's)", a)
		}
		if strings.Contains(a.res.Error, "shop.cart.events") {
			t.Errorf("the attempt's error reveals the other event's topic: %q", a.res.Error)
		}
		if n := outboxRows(s); n != 1 {
			t.Errorf("%d outbox rows, want 1 (the other event's only)", n)
		}
	})

	t.Run("unknown and unconsumed topics are skipped", func(t *testing.T) {
		var (
			mu      sync.Mutex
			results []outbox.Enqueued
		)
		h := consumer.HandlerFunc(func(ctx context.Context, c *consumer.Context) error {
			res, err := c.EmitResults(ctx,
				child("c-unknown", "shop.nobody.events", "v1", `{}`),
				child("c-ok", "member.points.events", "v1", `{"memberId": "m-1", "points": "5"}`),
				child("c-unconsumed", "shop.cart.events", "v1", `{}`))
			mu.Lock()
			results = res
			mu.Unlock()
			return err
		})
		var logs bytes.Buffer
		var logMu sync.Mutex
		s := newStackWith(t, pgtest.Schema(t), h, "member-service", func(o *consumer.Options) {
			o.Contract = ctr
			o.Logger = slog.New(slog.NewJSONHandler(lockedWriter{&logMu, &logs}, nil))
		})
		a := s.push(t, message(t, orderEvent("order-81", 1)), 1)
		if a.code != http.StatusOK || a.res.Outcome != model.OutcomeSuccess {
			t.Fatalf("%+v, want 200 succeeded: a skipped child does not fail the delivery", a)
		}
		mu.Lock()
		defer mu.Unlock()
		want := []outbox.State{outbox.StateSkipped, outbox.StatePending, outbox.StateSkipped}
		for i, r := range results {
			if r.State != want[i] {
				t.Errorf("child %d (%s): %s, want %s", i, r.ID, r.State, want[i])
			}
		}
		if n := s.count(t, `SELECT count(*) FROM relaybus_outbox WHERE id = 'c-ok'`); n != 1 || outboxRows(s) != 1 {
			t.Errorf("outbox: want only c-ok, have %d rows", outboxRows(s))
		}
		logMu.Lock()
		defer logMu.Unlock()
		for _, topic := range []string{"shop.nobody.events", "shop.cart.events"} {
			if !strings.Contains(logs.String(), `"level":"ERROR","msg":"outbox: event SKIPPED, nothing written"`) || !strings.Contains(logs.String(), `"topic":"`+topic+`"`) {
				t.Errorf("no ERROR logged for the child on %s:\n%s", topic, logs.String())
			}
		}
	})
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestBinaryModeArrivesThroughEveryRequestShape: the message the relay
// writes for a topic with a schema (CloudEvents binary mode: the data is
// the payload) is read by consume whether Pub/Sub pushes it wrapped or
// unwrapped or Eventarc delivers it, as the same event.
func TestBinaryModeArrivesThroughEveryRequestShape(t *testing.T) {
	s := newStack(t, projection.Latest(), "member-service")
	e := orderEvent("order-90", 1)
	if err := e.Prepare(time.Date(2026, 11, 22, 9, 0, 0, 0, time.UTC), event.Limits{}); err != nil {
		t.Fatal(err)
	}
	m, err := cloudevent.Encode(e, event.EncodingBinary)
	if err != nil {
		t.Fatal(err)
	}
	m.ID = "msg-bin"
	if string(m.Data) != string(e.Payload) || m.Attributes["ce-id"] != e.ID {
		t.Fatalf("not binary mode: data %s, attributes %v", m.Data, m.Attributes)
	}
	eventarc, err := delivery.EventarcRequest(s.url, "p", topic, sub, m)
	if err != nil {
		t.Fatal(err)
	}
	unwrapped, err := delivery.UnwrappedRequest(s.url, sub, m, 2)
	if err != nil {
		t.Fatal(err)
	}
	if a := s.push(t, m, 1); a.code != http.StatusOK || a.res.Outcome != model.OutcomeSuccess || a.res.EventID != e.ID {
		t.Fatalf("wrapped push: %+v", a)
	}
	for name, req := range map[string]*http.Request{"eventarc": eventarc, "unwrapped push": unwrapped} {
		if a := s.do(t, req); a.code != http.StatusOK || !a.res.Duplicate || a.res.EventID != e.ID {
			t.Errorf("%s: %+v, want the same event (a duplicate)", name, a)
		}
	}
	var member string
	_ = s.pool.QueryRow(context.Background(), `SELECT state->>'memberId' FROM relaybus_projection WHERE aggregate_id = 'order-90'`).Scan(&member)
	if member != "m-order-90" {
		t.Errorf("projection state memberId %q: the payload did not arrive as the event's data", member)
	}
}
