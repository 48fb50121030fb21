package publish_test

import (
	"fmt"
	"testing"

	"github.com/relaybus/relaybus/internal/benchcheck"
	"github.com/relaybus/relaybus/internal/telemetry"
	"github.com/relaybus/relaybus/internal/telemetrytest"
)

// BenchmarkPublishTelemetryOverhead runs BenchmarkPublish's load six
// times, telemetry off, on, off, on, off, on in the function's process
// (the default sampling, exported over OTLP/gRPC to a collector in this
// process that counts and drops), and reports the median of the rounds'
// p50 latency added (interleavedLoads): publish_telemetry_overhead_pct.
func BenchmarkPublishTelemetryOverhead(b *testing.B) {
	sink := telemetrytest.Collector(b)
	off, on := interleavedLoads(b, nil, map[string]string{"TELEMETRY_EXPORT": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": sink.Endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_TRACES_SAMPLER": "relaybus"})
	printCPUOverhead(b, "publish telemetry overhead", off, on)
	benchcheck.Overhead(b, "publish_telemetry_overhead_pct",
		fmt.Sprintf("publish_p50_ms with telemetry off → on in the function's process (sampling %g at the root, exported over OTLP/gRPC to a local collector that received %d spans)",
			telemetry.DefaultSampleRatio, sink.Spans()), p50s(off), p50s(on), false)
}
