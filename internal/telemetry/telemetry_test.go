package telemetry_test

import (
	"context"
	"errors"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/trace"

	"github.com/relaybus/relaybus/internal/otelsetup"
	"github.com/relaybus/relaybus/internal/telemetry"
)

func TestTraceparentRoundTripsAndRefusesWhatW3CRefuses(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	sc, ok := telemetry.ParseTraceparent(tp)
	if !ok || !sc.IsRemote() || !sc.IsSampled() || sc.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || sc.SpanID().String() != "00f067aa0ba902b7" {
		t.Fatalf("parse %s: %v %v", tp, sc, ok)
	}
	if got := telemetry.FormatTraceparent(sc); got != tp {
		t.Errorf("format: %s, want %s", got, tp)
	}
	if got := telemetry.FormatTraceparent(trace.SpanContext{}); got != "" {
		t.Errorf("format of no span: %q", got)
	}
	for _, bad := range []string{
		"", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7", // too short
		"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",   // version ff
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01",   // zero trace id
		"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",   // zero span id
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",   // upper case
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x", // version 00 with more
		"00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
	} {
		if _, ok := telemetry.ParseTraceparent(bad); ok {
			t.Errorf("%q parsed as valid", bad)
		}
	}
	// A future version may append fields.
	if _, ok := telemetry.ParseTraceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"); !ok {
		t.Error("a future version's traceparent was refused")
	}
}

// A gauge whose read fails (a pool closed, a database down) loses its own
// points of that collection, not the other metrics': the SDK drops a whole
// collection when a callback returns an error, which is how a shutdown
// with the outbox pool closed exported no metric at all.
func TestAFailingGaugeKeepsTheOtherMetrics(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	tp := otelsetup.NewTracerProvider(1, nil)
	restore := telemetry.Install(tp, mp)
	defer restore()
	unregister := telemetry.ObserveOutbox("main", func(context.Context) (telemetry.OutboxBacklog, error) {
		return telemetry.OutboxBacklog{}, errors.New("outbox: count: closed pool")
	})
	defer unregister() //nolint:errcheck
	telemetry.RecordPublishRequest(context.Background(), 202, time.Millisecond)
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatalf("collect: %v (a failing gauge fails the collection)", err)
	}
	found := false
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			found = found || m.Name == telemetry.MetricPublishRequestDuration
		}
	}
	if !found {
		t.Error("the request duration was dropped with the failing gauge")
	}
}
