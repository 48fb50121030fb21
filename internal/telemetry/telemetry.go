// Package telemetry is relaybus's OpenTelemetry: the hooks every hop
// records through (spans, the messaging metrics, the hop histograms and the
// outbox and gap gauges), the W3C trace context stored with outbox rows and
// carried on Pub/Sub messages, and the process's SDK set up from the
// OpenTelemetry environment variables.
//
// The package has two halves. The hooks (telemetry.go, span.go,
// metrics.go, propagation.go, postgres.go) are what the engines call; with
// telemetry off each is one atomic load and a return. The SDK set-up
// (setup.go, resource.go, sampler.go) is the host's: it reads the standard
// OTEL_* variables as the OpenTelemetry specification defines them, builds
// the OTLP exporters (gRPC or HTTP/protobuf), the sampler and the resource,
// and installs them with Install; no engine calls into it.
//
// Telemetry is off unless an export is configured (see Config): an OTLP
// endpoint (a local collector, Jaeger, ...) or, on Cloud Run with a
// project, Google's Telemetry (OTLP) API, telemetry.googleapis.com, which
// takes traces and metrics in OTLP as they are
// (https://cloud.google.com/trace/docs/migrate-to-otlp-endpoints). Metrics
// sent there land in Cloud Monitoring with the Prometheus mapping
// (https://cloud.google.com/stackdriver/docs/reference/telemetry/v1.metrics),
// so the dashboard queries them with PromQL.
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
// returns a function that puts back the previous ones. Setup calls it;
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
