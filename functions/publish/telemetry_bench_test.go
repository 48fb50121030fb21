package publish_test

import (
	"fmt"
	"testing"

	"github.com/relaybus/relaybus/internal/telemetrytest"
	"github.com/relaybus/relaybus/shared/telemetry"
)

// BenchmarkPublishTelemetryOverhead runs BenchmarkPublish's load four
// times, telemetry off, on, on, off in the function's process (the default
// sampling, exported over OTLP/gRPC to a collector in this process that
// counts and drops), and reports the p50 latency added, from each side's
// mean (interleavedLoads): publish_telemetry_overhead_pct.
func BenchmarkPublishTelemetryOverhead(b *testing.B) {
	sink := telemetrytest.Collector(b)
	off, on := interleavedLoads(b, nil, map[string]string{"TELEMETRY_EXPORT": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": sink.Endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_TRACES_SAMPLER": "relaybus"})
	offP50, offP99, onP50, onP99 := off.p50, off.p99, on.p50, on.p99
	fmt.Printf("# publish telemetry overhead: the publish load above four times, telemetry off, on, on, off in the function's process (sampling %g at the root, "+
		"exported over OTLP/gRPC to a local collector that received %d spans); A, B, B, A; the mean of each side\n", telemetry.DefaultSampleRatio, sink.Spans())
	fmt.Printf("# publish_p50_ms telemetry off %.2f ms, on %.2f ms, ratio on/off %.3f; p99 off %.2f ms, on %.2f ms\n", offP50, onP50, onP50/offP50, offP99, onP99)
	printCPUOverhead("publish telemetry overhead", off, on)
	fmt.Printf("BENCH publish_telemetry_overhead_pct %.1f %%\n", (onP50-offP50)/offP50*100)
}
