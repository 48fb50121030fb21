package forward_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/relaybus/relaybus/internal/otelsetup"
	"github.com/relaybus/relaybus/internal/telemetry"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/forward"
)

// What the operator sees when a target goes down: the call that opens the
// breaker is held (a *consumer.HeldError, not a failure), the transition
// is logged at WARNING with the reason and counted by the state entered,
// and the state gauge reads 2 (open).
func TestTheBreakerOpeningIsLoggedCountedAndGauged(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	restore := telemetry.Install(otelsetup.NewTracerProvider(1, nil), sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	defer restore()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // connections to addr are refused
	var logs bytes.Buffer
	f, err := forward.New(forward.Options{URL: "http://" + addr + "/", Name: "archive-service",
		Logger: slog.New(slog.NewJSONHandler(&logs, nil)), Breaker: forward.BreakerOptions{Threshold: 1}})
	if err != nil {
		t.Fatal(err)
	}
	unregister := telemetry.ObserveBreaker("archive-service", func() int64 { return int64(f.BreakerState()) })
	defer unregister() //nolint:errcheck

	herr := f.Handle(context.Background(), ctxFor())
	var held *consumer.HeldError
	if !errors.As(herr, &held) || held.RetryAfter <= 0 {
		t.Fatalf("the call that opens the breaker returned %v; want a HeldError with a RetryAfter", herr)
	}
	if _, err := f.Admit(context.Background()); !errors.As(err, &held) {
		t.Fatalf("Admit while open: %v, want a HeldError", err)
	}
	if l := logs.String(); !strings.Contains(l, `"msg":"forward: circuit breaker open; deliveries held without spending their attempts"`) ||
		!strings.Contains(l, `"level":"WARN"`) || !strings.Contains(l, "connection refused") || strings.Contains(l, addr+"/") {
		t.Errorf("log %s; want one WARN line naming the reason, without the URL", l)
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var transitions, state int64 = -1, -1
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch m.Name {
			case telemetry.MetricBreakerTransitions:
				for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
					if v, _ := p.Attributes.Value(telemetry.KeyState); v.AsString() == "open" {
						transitions = p.Value
					}
				}
			case telemetry.MetricBreakerState:
				for _, p := range m.Data.(metricdata.Gauge[int64]).DataPoints {
					state = p.Value
				}
			}
		}
	}
	if transitions != 1 || state != 2 {
		t.Errorf("transitions to open %d, state gauge %d; want 1 and 2", transitions, state)
	}
}
