package dlqreplay_test

import (
	"context"
	"strings"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/internal/deadletter"
	"github.com/relaybus/relaybus/internal/otelsetup"
	"github.com/relaybus/relaybus/internal/telemetry"
	"github.com/relaybus/relaybus/internal/traceparent"
	"github.com/relaybus/relaybus/shared/event"
)

// An operator's replay and re-push are traced whatever the sampling ratio
// (here 0: nothing else is): each starts a span forced sampled in the
// event's own trace, and what goes on carries it: the replayed message's
// googclient_traceparent and the re-push's outbox row, so the consumers'
// deliveries of the replay or re-push are recorded under it.
func TestReplayAndRepushAreSampled(t *testing.T) {
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans), sdktrace.WithSampler(otelsetup.Sampler(0)))
	restore := telemetry.Install(tp, sdkmetric.NewMeterProvider())
	defer restore()
	ctx := context.Background()
	e := newEnv(t, dlqreplay.AuthNone, "")

	// A replay.
	orig := orderMessage("evt-traced")
	maxed := deadletter.PubSub(orig, "p", "shop.order.events.message-service-processor", 5)
	maxed.ID = "dl-traced"
	e.archiveDelivery(t, maxed)
	var plan map[string]any
	if code := e.call(t, "POST", "/deadletters/dl-traced:replay", nil, &plan); code != 200 {
		t.Fatalf("replay: %d %v", code, plan)
	}
	msgs := e.fake.Server.Messages()
	if len(msgs) != 1 {
		t.Fatalf("%d messages published, want the replay", len(msgs))
	}
	sent := msgs[0].Attributes[telemetry.AttrTraceparent]
	sc, ok := traceparent.Parse(sent)
	if !ok || !sc.IsSampled() || sc.TraceID().String() != orig.Attributes[event.AttrTraceID] {
		t.Fatalf("the replay carries traceparent %q, want a sampled one in the event's trace %s", sent, orig.Attributes[event.AttrTraceID])
	}

	// A re-push.
	now := time.Now().UTC()
	ev := &event.Event{ID: "evt-repushed", Type: "order.purchased", Source: "order-service", Topic: "shop.order.events",
		AggregateID: "order-r", Version: 1, Payload: []byte(`{"orderId":"r"}`)}
	if err := ev.Prepare(now, event.Limits{}); err != nil {
		t.Fatal(err)
	}
	if err := e.store.RecordPublishFailure(ctx, ev, 5, "permission denied", true, now); err != nil {
		t.Fatal(err)
	}
	if code := e.call(t, "POST", "/events/evt-repushed:repush", nil, &plan); code != 200 {
		t.Fatalf("re-push: %d %v", code, plan)
	}
	var row string
	if err := e.db.QueryRow(ctx, `SELECT traceparent FROM relaybus_outbox WHERE id = $1`, ev.ID).Scan(&row); err != nil {
		t.Fatal(err)
	}
	sc, ok = traceparent.Parse(row)
	if !ok || !sc.IsSampled() || sc.TraceID().String() != ev.TraceID {
		t.Fatalf("the re-push's outbox row keeps traceparent %q, want a sampled one in the event's trace %s", row, ev.TraceID)
	}

	names := map[string]bool{}
	for _, s := range spans.GetSpans().Snapshots() {
		names[s.Name()] = true
		if strings.HasPrefix(s.Name(), "replay ") || strings.HasPrefix(s.Name(), "repush ") {
			if !s.SpanContext().IsSampled() {
				t.Errorf("span %s is not sampled", s.Name())
			}
		}
	}
	if !names["replay shop.order.events"] || !names["repush shop.order.events"] {
		t.Errorf("spans %v, want the replay's and the re-push's", names)
	}
}
