package consume_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/shared/ledger"
	"github.com/relaybus/relaybus/shared/projection"
	"github.com/relaybus/relaybus/shared/telemetry"
)

// gauge returns the last value of a gauge for consumer.
func gauge(t *testing.T, r *sdkmetric.ManualReader, name, consumer string) (float64, bool) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch d := m.Data.(type) {
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					if v, _ := p.Attributes.Value(attribute.Key("relaybus.consumer")); v.AsString() == consumer {
						return p.Value, true
					}
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					if v, _ := p.Attributes.Value(attribute.Key("relaybus.consumer")); v.AsString() == consumer {
						return float64(p.Value), true
					}
				}
			}
		}
	}
	return 0, false
}

// A strict consumer reports its open gaps and the age of the oldest parked
// event as gauges, read from its own tables at each collection.
func TestStrictGapsAreGauges(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	restore := telemetry.Install(sdktrace.NewTracerProvider(), sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	defer restore()
	pool := pgtest.Schema(t)
	clock := &testClock{now: time.Date(2026, 11, 22, 9, 0, 0, 0, time.UTC)}
	res := projection.NewStrict(appliedLog(t, pool), projection.StrictOptions{GapTimeout: 10 * time.Minute, Now: clock.Now})
	s := newStackWith(t, pool, res, "audit-service", nil)

	if v, ok := gauge(t, reader, telemetry.MetricStrictOpenGaps, "audit-service"); !ok || v != 0 {
		t.Fatalf("no gap: open gaps %v (%v), want 0", v, ok)
	}
	for _, agg := range []string{"order-a", "order-b"} {
		if a := s.push(t, message(t, orderEvent(agg, 1)), 1); a.res.Outcome != ledger.OutcomeSuccess {
			t.Fatalf("%s v1: %+v", agg, a)
		}
		if a := s.push(t, message(t, orderEvent(agg, 3)), 1); a.res.Outcome != ledger.OutcomeParked {
			t.Fatalf("%s v3: %+v", agg, a)
		}
		clock.Advance(2 * time.Minute)
	}
	clock.Advance(time.Minute)
	if v, _ := gauge(t, reader, telemetry.MetricStrictOpenGaps, "audit-service"); v != 2 {
		t.Errorf("open gaps %v, want 2", v)
	}
	// order-a's v3 was parked at 9:00; it is 9:05 by the resequencer's clock.
	if v, _ := gauge(t, reader, telemetry.MetricStrictOldestGapAge, "audit-service"); v != 300 {
		t.Errorf("oldest gap age %v s, want 300", v)
	}
}
