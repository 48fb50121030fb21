package telemetry_test

import (
	"context"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/relaybus/relaybus/internal/otelsetup"
	"github.com/relaybus/relaybus/internal/telemetry"
	"github.com/relaybus/relaybus/internal/traceparent"
)

// What the hot paths pay, in allocations (the hooks' share of the
// issue's 5% budget): nothing when telemetry is off, nothing per metric
// point when it is on, and only the span's own allocations when a trace
// is dropped by sampling.
func TestHooksCostNothingWhenOffAndMetricsAllocateNothing(t *testing.T) {
	ctx := context.Background()
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	off := testing.AllocsPerRun(1000, func() {
		c, s := telemetry.Start(ctx, "process shop.order.events", telemetry.KindConsumer, tp)
		s.End(nil)
		telemetry.RecordConsume(c, "shop.order.events", "sub", "member-service", "success", time.Millisecond)
		telemetry.RecordHop(c, telemetry.HopEndToEnd, "shop.order.events", "member-service", time.Millisecond)
		telemetry.RecordProjection(c, "member.points.events", "audit-service", 7, 6, true)
		_ = traceparent.FromContext(c)
	})
	if off != 0 {
		t.Errorf("telemetry off: %v allocations per delivery, want 0", off)
	}

	tprov := otelsetup.NewTracerProvider(0, nil, sdktrace.WithSyncer(tracetest.NewInMemoryExporter()))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	restore := telemetry.Install(tprov, mp)
	defer restore()
	record := func() {
		telemetry.RecordConsume(ctx, "shop.order.events", "sub", "member-service", "success", time.Millisecond)
		telemetry.RecordHop(ctx, telemetry.HopEndToEnd, "shop.order.events", "member-service", time.Millisecond)
		telemetry.RecordPublish(ctx, "shop.order.events", 3, 0, time.Millisecond, nil)
		telemetry.RecordProjection(ctx, "member.points.events", "audit-service", 7, 6, true)
		telemetry.RecordProjection(ctx, "member.points.events", "audit-service", 3, 6, false)
	}
	record() // the attribute sets are built once
	if n := testing.AllocsPerRun(1000, record); n != 0 {
		t.Errorf("telemetry on: %v allocations per metric points, want 0", n)
	}
	dropped := testing.AllocsPerRun(1000, func() {
		_, s := telemetry.Start(ctx, "process shop.order.events", telemetry.KindConsumer, tp)
		s.End(nil)
	})
	t.Logf("a span dropped by sampling: %v allocations", dropped)
	if dropped > 12 {
		t.Errorf("a span dropped by sampling: %v allocations, want at most 12", dropped)
	}
}
