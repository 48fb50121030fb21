package projection_test

import (
	"context"
	"fmt"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/internal/telemetry"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/projection"
)

// A state projection's version lag, as a manual reader collects it over a
// scripted run on real Postgres: each applied event records the versions
// the projection jumped over (0 in order), each event it did not apply
// (it held that version or a newer one) counts as stale, per topic and
// consumer, and the projection ends on the newest version.
func TestLatestRecordsTheVersionLag(t *testing.T) {
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	tp := sdktrace.NewTracerProvider()
	restore := telemetry.Install(tp, sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	defer restore()

	db := pgtest.Schema(t)
	if err := projection.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	h := projection.Latest()
	apply := func(topic, cons, agg string, version int64) {
		t.Helper()
		tx, err := db.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck // after the commit it does nothing
		e := &event.Event{ID: event.NewID(), Type: "member.updated", Topic: topic, AggregateType: "member",
			AggregateID: agg, Version: version, PayloadType: "application/json", Payload: []byte(fmt.Sprintf(`{"v":%d}`, version))}
		if err := h.Handle(ctx, &consumer.Context{Event: e, Tx: tx, ConsumerID: cons}); err != nil {
			t.Fatalf("%s v%d: %v", agg, version, err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// m-1 of audit-service: 1, 2 in order; 5 jumps over 3 and 4; 3 and a
	// second event of version 5 arrive late; 6 is next.
	for _, v := range []int64{1, 2, 5, 3, 5, 6} {
		apply("member.events", "audit-service", "m-1", v)
	}
	// m-2: first seen at version 4 (started mid-stream: 3 jumped over).
	apply("member.events", "audit-service", "m-2", 4)
	// Another consumer of the same topic, in order.
	apply("member.events", "mail-service", "m-1", 1)

	if v, err := projection.HeldVersion(ctx, db, "projection", "audit-service", "member", "m-1"); err != nil || v != 6 {
		t.Fatalf("audit-service holds m-1 at %d (%v), want 6", v, err)
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	type lag struct {
		count, sum int64
		buckets    []uint64
	}
	lags, stale := map[string]lag{}, map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Histogram[int64]:
				if m.Name != telemetry.MetricProjectionVersionLag {
					continue
				}
				if m.Unit != "{version}" {
					t.Errorf("%s unit %q", m.Name, m.Unit)
				}
				for _, p := range d.DataPoints {
					lags[labels(p.Attributes)] = lag{int64(p.Count), p.Sum, p.BucketCounts}
				}
			case metricdata.Sum[int64]:
				if m.Name == telemetry.MetricProjectionStale {
					for _, p := range d.DataPoints {
						stale[labels(p.Attributes)] += p.Value
					}
				}
			}
		}
	}
	// audit-service applied 1, 2, 5, 6 of m-1 (lags 0, 0, 2, 0) and 4 of
	// m-2 (lag 3): five points summing 5, two of them above the in-order 0.
	// Buckets: (-inf,0] (0,1] (1,2] (2,5] ...
	want := map[string]lag{
		"member.events/audit-service": {5, 5, []uint64{3, 0, 1, 1, 0, 0, 0, 0, 0, 0}},
		"member.events/mail-service":  {1, 0, []uint64{1, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
	}
	if fmt.Sprint(lags) != fmt.Sprint(want) {
		t.Errorf("%s: %v, want %v", telemetry.MetricProjectionVersionLag, lags, want)
	}
	if w := map[string]int64{"member.events/audit-service": 2}; fmt.Sprint(stale) != fmt.Sprint(w) {
		t.Errorf("%s: %v, want %v (the late 3 and the second 5)", telemetry.MetricProjectionStale, stale, w)
	}
}

// labels is a data point's topic/consumer; any other attribute fails the
// label set's low-cardinality promise and shows in the key.
func labels(s attribute.Set) string {
	out := ""
	for _, kv := range s.ToSlice() {
		switch kv.Key {
		case telemetry.KeyDestination, telemetry.KeyConsumer:
		default:
			out += "+" + string(kv.Key) + "=" + kv.Value.String()
		}
	}
	topic, _ := s.Value(telemetry.KeyDestination)
	cons, _ := s.Value(telemetry.KeyConsumer)
	return topic.String() + "/" + cons.String() + out
}
