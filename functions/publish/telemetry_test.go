package publish_test

import (
	"context"
	"net/http"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/relaybus/relaybus/functions/publish"
	"github.com/relaybus/relaybus/internal/telemetry"
)

// With telemetry on, a publish request is a server span continuing the
// caller's traceparent header, and the outbox row keeps that span's
// context: the event's trace is the caller's, and the relay and the
// consumers continue it under the request. Without a header, the event's
// trace id is the request span's.
func TestThePublishRequestSpanIsWhatTheRowKeeps(t *testing.T) {
	spans := tracetest.NewInMemoryExporter()
	restore := telemetry.Install(telemetry.NewTracerProvider(1, nil, sdktrace.WithSyncer(spans)), sdkmetric.NewMeterProvider())
	defer restore()
	h := newHarness(t, nil)
	const caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"

	traceparent := func(id string) string {
		var tp string
		if err := h.pool.QueryRow(context.Background(), `SELECT traceparent FROM relaybus_outbox WHERE id = $1`, id).Scan(&tp); err != nil {
			t.Fatal(err)
		}
		return tp
	}
	status, body, _ := post(t, h.url, mustJSON(t, envelope(map[string]any{"eventId": "evt-tp-1"})), "Content-Type", "application/json", "traceparent", caller)
	if status != http.StatusAccepted {
		t.Fatalf("status %d: %s", status, body)
	}
	var server tracetest.SpanStub
	for _, sp := range spans.GetSpans() {
		if sp.Name == "publish" {
			server = sp
		}
	}
	// The caller's flag said "not sampled"; relaybus samples at its own
	// ratio (1 here), so the request is recorded, under the caller's span.
	if server.SpanKind.String() != "server" || server.SpanContext.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" ||
		server.Parent.SpanID().String() != "00f067aa0ba902b7" {
		t.Fatalf("request span %+v", server)
	}
	if got, want := traceparent("evt-tp-1"), "00-4bf92f3577b34da6a3ce929d0e0e4736-"+server.SpanContext.SpanID().String()+"-01"; got != want {
		t.Errorf("row traceparent %q, want the request span's %q", got, want)
	}

	_, body, _ = post(t, h.url, mustJSON(t, envelope(map[string]any{"eventId": "evt-tp-2", "aggregateId": "order-9"})), "Content-Type", "application/json")
	res := decodeJSON[publish.Result](t, body)
	if tp := traceparent("evt-tp-2"); len(tp) != 55 || tp[3:35] != res.TraceID {
		t.Errorf("no header: event trace %q, row traceparent %q; want the request span's trace", res.TraceID, tp)
	}
}
