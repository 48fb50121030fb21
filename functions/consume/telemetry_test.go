package consume_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/ledger/model"
	"github.com/relaybus/relaybus/internal/otelsetup"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/relaybus/relaybus/internal/delivery"
	"github.com/relaybus/relaybus/internal/pgpool"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/internal/telemetry"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/projection"
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
		if a := s.push(t, message(t, orderEvent(agg, 1)), 1); a.res.Outcome != model.OutcomeSuccess {
			t.Fatalf("%s v1: %+v", agg, a)
		}
		if a := s.push(t, message(t, orderEvent(agg, 3)), 1); a.res.Outcome != model.OutcomeParked {
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

// A delivery continues its producer's trace from the message's
// googclient_traceparent, whatever the request's shape (push, Eventarc):
// the delivery's span is the producer span's child, the handler's span is
// under it, the Postgres statements are spans under them, and the child
// event the handler emits keeps the handler span's context in the outbox.
// The producer's sampling decision holds (the sampler's ratio here is 0):
// an unsampled producer's delivery records nothing and its child's row
// says so.
func TestADeliveryContinuesItsProducersTrace(t *testing.T) {
	spans := tracetest.NewInMemoryExporter()
	tp := otelsetup.NewTracerProvider(0, nil, sdktrace.WithSyncer(spans))
	restore := telemetry.Install(tp, sdkmetric.NewMeterProvider())
	defer restore()
	pool, _ := pgtest.SchemaConfig(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = pgpool.QueryTracer() })
	emit := consumer.HandlerFunc(func(ctx context.Context, c *consumer.Context) error {
		return c.Emit(ctx, &event.Event{ID: "child-of-" + c.Event.ID, Type: "points.added", Topic: "member.points.events",
			AggregateType: "member", AggregateID: "m-" + c.Event.AggregateID, Version: 1, Payload: []byte(`{"points":1}`)})
	})
	s := newStackOn(t, pool, emit, "member-service")

	for _, c := range []struct {
		mode, producer string
		sampled        bool
	}{
		{"push", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", true},
		{"eventarc", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", true},
		{"push", "00-5cf92f3577b34da6a3ce929d0e0e4736-10f067aa0ba902b7-00", false},
	} {
		e := orderEvent("order-"+c.producer[3:11], 1)
		m := message(t, e)
		m.Attributes[telemetry.AttrTraceparent] = c.producer
		var a answer
		if c.mode == "push" {
			a = s.push(t, m, 1)
		} else {
			req, err := delivery.EventarcRequest(s.url, "p", topic, sub, m)
			if err != nil {
				t.Fatal(err)
			}
			a = s.do(t, req)
		}
		if a.code != 200 || a.res.Outcome != model.OutcomeSuccess {
			t.Fatalf("%s: %+v", c.mode, a)
		}
		trace, producerSpan := c.producer[3:35], c.producer[36:52]
		var process, handler tracetest.SpanStub
		var statements []tracetest.SpanStub
		for _, sp := range spans.GetSpans() {
			if sp.SpanContext.TraceID().String() != trace {
				continue
			}
			switch {
			case sp.Name == "process "+topic:
				process = sp
			case sp.Name == "handle order.purchased":
				handler = sp
			case strings.HasPrefix(sp.Name, "pg "):
				statements = append(statements, sp)
			}
		}
		var row string
		if err := pool.QueryRow(context.Background(), `SELECT traceparent FROM relaybus_outbox WHERE id = $1`, "child-of-"+e.ID).Scan(&row); err != nil {
			t.Fatal(err)
		}
		if !c.sampled {
			if process.SpanContext.IsValid() || handler.SpanContext.IsValid() || len(statements) > 0 {
				t.Errorf("an unsampled producer's delivery recorded spans")
			}
			if !strings.HasPrefix(row, "00-"+trace+"-") || !strings.HasSuffix(row, "-00") {
				t.Errorf("the child of an unsampled delivery: traceparent %q, want its trace, not sampled", row)
			}
			continue
		}
		if process.Parent.SpanID().String() != producerSpan || !process.Parent.IsRemote() || process.SpanKind.String() != "consumer" {
			t.Errorf("%s: the delivery's span %+v is not the producer span's (remote) child", c.mode, process.Parent)
		}
		if handler.Parent.SpanID() != process.SpanContext.SpanID() {
			t.Errorf("%s: the handler's span is not under the delivery's", c.mode)
		}
		// A statement's span is under the delivery, the handler, or the
		// statement it prepares for (a connection's first run of it).
		byID := map[string]tracetest.SpanStub{}
		for _, st := range statements {
			byID[st.SpanContext.SpanID().String()] = st
		}
		names := map[string]bool{}
		for _, st := range statements {
			names[st.Name] = true
			p := st.Parent.SpanID()
			for up, ok := byID[p.String()]; ok; up, ok = byID[p.String()] {
				p = up.Parent.SpanID()
			}
			if p != process.SpanContext.SpanID() && p != handler.SpanContext.SpanID() {
				t.Errorf("%s: statement %s is not under the delivery or the handler", c.mode, st.Name)
			}
		}
		if !names["pg Enqueue"] || len(statements) < 3 {
			t.Errorf("%s: statement spans %v, want the inbox's and the child's Enqueue among them", c.mode, names)
		}
		if want := "00-" + trace + "-" + handler.SpanContext.SpanID().String() + "-01"; row != want {
			t.Errorf("%s: the child's row keeps %q, want the handler span's %q", c.mode, row, want)
		}
	}
}
