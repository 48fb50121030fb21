package pgopen

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/internal/telemetry"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// A pool the host opens traces its statements when telemetry is on: each
// statement under a recorded span is a span named by its leading comment.
func TestOpenTracesStatementsWhenTelemetryIsOn(t *testing.T) {
	url := pgtest.URL(t)
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	restore := telemetry.Install(tp, noop.NewMeterProvider())
	defer restore()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pool, err := Open(ctx, instance.Database{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ctx, parent := tp.Tracer("test").Start(ctx, "request")
	defer parent.End()
	if _, err := pool.Exec(ctx, "-- Probe: the test's statement\nSELECT 1"); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range spans.Ended() {
		names = append(names, s.Name())
		if s.Name() == "pg Probe" {
			return
		}
	}
	t.Errorf("spans %q, want one named \"pg Probe\"", names)
}

// Without telemetry, the pool has no tracer.
func TestOpenTracesNothingWhenTelemetryIsOff(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pool, err := Open(ctx, instance.Database{URL: pgtest.URL(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if tr := pool.Config().ConnConfig.Tracer; tr != nil {
		t.Errorf("tracer %T with telemetry off, want none", tr)
	}
}

// An empty DATABASE_URL is refused, naming the variable.
func TestOpenRefusesAnEmptyURL(t *testing.T) {
	if _, err := Open(context.Background(), instance.Database{}); err == nil || err.Error() != "DATABASE_URL is not set" {
		t.Errorf("err = %v, want DATABASE_URL is not set", err)
	}
}
