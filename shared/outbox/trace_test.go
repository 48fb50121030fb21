package outbox_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/relaybus/relaybus/shared/outbox"
)

// producerCtx is a Go producer's context inside a sampled span.
func producerCtx() (context.Context, string) {
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled})
	return trace.ContextWithSpanContext(context.Background(), sc), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
}

// Enqueue keeps the producer's span context with each row, and the relay's
// claim hands it back; an event without a trace id takes the span's; no
// span, no traceparent. The migration that adds the column runs twice.
func TestEnqueueKeepsTheProducersTraceparent(t *testing.T) {
	pool := newDB(t)
	if err := outbox.Migrate(context.Background(), pool); err != nil {
		t.Fatalf("the migrations again: %v", err)
	}
	ctx, tp := producerCtx()
	own := ev("e2", "B", 1)
	own.TraceID = "0af7651916cd43dd8448eb211c80319c"
	if _, err := outbox.Enqueue(ctx, pool, ev("e1", "A", 1), own); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Enqueue(context.Background(), pool, ev("e3", "C", 1)); err != nil {
		t.Fatal(err)
	}
	got := map[string][2]string{}
	for _, r := range claim(t, pool, time.Time{}, "relay-1") {
		for _, row := range r.Rows {
			got[row.Event.ID] = [2]string{row.Traceparent, row.Event.TraceID}
		}
	}
	if got["e1"] != [2]string{tp, "4bf92f3577b34da6a3ce929d0e0e4736"} {
		t.Errorf("e1: traceparent and trace id %q", got["e1"])
	}
	if got["e2"] != [2]string{tp, "0af7651916cd43dd8448eb211c80319c"} {
		t.Errorf("e2 (its own trace id): %q", got["e2"])
	}
	if got["e3"][0] != "" || len(got["e3"][1]) != 32 {
		t.Errorf("e3 (no span): %q, want no traceparent and a generated trace id", got["e3"])
	}
}

// Oldest is the age of the oldest unpublished row, and 0 once everything
// is published.
func TestOldestIsTheAgeOfTheOldestUnpublishedRow(t *testing.T) {
	ctx := context.Background()
	pool := newDB(t)
	if age, err := outbox.Oldest(ctx, pool); err != nil || age != 0 {
		t.Fatalf("empty outbox: %v %v", age, err)
	}
	if _, err := outbox.Enqueue(ctx, pool, ev("e1", "A", 1), ev("e2", "A", 2), ev("e3", "B", 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE relaybus_outbox SET created_at = now() - interval '90 seconds' WHERE id = 'e1'`); err != nil {
		t.Fatal(err)
	}
	age, err := outbox.Oldest(ctx, pool)
	if err != nil || age < 90*time.Second || age > 100*time.Second {
		t.Fatalf("oldest %v (%v), want about 90s", age, err)
	}
	runs := claim(t, pool, time.Time{}, "relay-1")
	var ps []outbox.Progress
	for _, r := range runs {
		ps = append(ps, published(r))
	}
	if _, err := outbox.Settle(ctx, pool, outbox.SettleOptions{}, ps); err != nil {
		t.Fatal(err)
	}
	if age, err := outbox.Oldest(ctx, pool); err != nil || age != 0 {
		t.Fatalf("all published: %v %v", age, err)
	}
}
