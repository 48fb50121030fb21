// Package telemetry is relaybus's OpenTelemetry instrumentation: the hooks
// every hop records through (spans, the messaging metrics, the hop
// histograms and the outbox and gap gauges) and the W3C trace context
// stored with outbox rows and carried on Pub/Sub messages.
//
// The package imports the OpenTelemetry API only: what engines and the
// programs that import them link (the pgx tracer that makes statements
// spans is internal/pgpool's QueryTracer, beside the pools).
// With telemetry off each hook is one atomic load and a return. The SDK
// (the OTLP exporters, the sampler, the resource, read from the OTEL_*
// variables) is the host's: internal/otelsetup builds it and installs it
// here with Install.
package telemetry

import (
	"sync/atomic"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// state is what the hooks record into; nil when telemetry is off.
type state struct {
	provider trace.TracerProvider
	tracer   trace.Tracer
	inst     *instruments
}

var current atomic.Pointer[state]

// Install makes tp and mp the providers relaybus's hooks record into and
// returns a function that puts back the previous ones. The host's
// set-up (internal/otelsetup) calls it;
// tests call it with an in-memory exporter and a manual reader.
func Install(tp trace.TracerProvider, mp metric.MeterProvider) (restore func()) {
	s := &state{provider: tp, tracer: tp.Tracer(scope), inst: newInstruments(mp.Meter(scope))}
	prev := current.Swap(s)
	return func() { current.CompareAndSwap(s, prev) }
}

// scope is the instrumentation scope of relaybus's spans and metrics.
const scope = "github.com/relaybus/relaybus"

// Enabled reports whether telemetry is installed.
func Enabled() bool { return current.Load() != nil }

// TracerProvider returns the installed tracer provider, or nil when
// telemetry is off: for instrumentation built outside this package (the
// pools' statement tracer, internal/pgpool.QueryTracer).
func TracerProvider() trace.TracerProvider {
	if st := current.Load(); st != nil {
		return st.provider
	}
	return nil
}
