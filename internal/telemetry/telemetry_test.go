package telemetry_test

import (
	"context"
	"errors"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/relaybus/relaybus/internal/otelsetup"
	"github.com/relaybus/relaybus/internal/telemetry"
)

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
