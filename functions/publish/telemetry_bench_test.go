package publish_test

import (
	"fmt"
	"testing"

	"github.com/relaybus/relaybus/internal/telemetrytest"
	"github.com/relaybus/relaybus/shared/telemetry"
)

// BenchmarkPublishTelemetryOverhead runs BenchmarkPublish's load four
// times, telemetry off, on, off, on in the function's process (the default
// sampling, exported over OTLP/gRPC to a collector in this process that
// counts and drops), and reports the p50 latency added by the best run of
// each: publish_telemetry_overhead_pct. Interleaving the runs and keeping
// the best of each cancels the drift of a long run (the shared Postgres
// and emulators carry the earlier runs' data and their background work),
// which a single off-then-on pair charged to telemetry.
func BenchmarkPublishTelemetryOverhead(b *testing.B) {
	sink := telemetrytest.Collector(b)
	on := map[string]string{"TELEMETRY_EXPORT": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": sink.Endpoint}
	best := func(p50, p99, bestP50, bestP99 float64) (float64, float64) {
		if bestP50 == 0 || p50 < bestP50 {
			return p50, p99
		}
		return bestP50, bestP99
	}
	var offP50, offP99, onP50, onP99 float64
	for range 2 {
		p50, p99 := publishLoad(b, false, nil)
		offP50, offP99 = best(p50, p99, offP50, offP99)
		p50, p99 = publishLoad(b, false, on)
		onP50, onP99 = best(p50, p99, onP50, onP99)
	}
	fmt.Printf("# publish telemetry overhead: the publish load above four times, telemetry off, on, off, on in the function's process (sampling %g at the root, "+
		"exported over OTLP/gRPC to a local collector that received %d spans); the best run of each\n", telemetry.DefaultSampleRatio, sink.Spans())
	fmt.Printf("# publish_p50_ms telemetry off %.2f ms, on %.2f ms, ratio on/off %.3f; p99 off %.2f ms, on %.2f ms\n", offP50, onP50, onP50/offP50, offP99, onP99)
	fmt.Printf("BENCH publish_telemetry_overhead_pct %.1f %%\n", (onP50-offP50)/offP50*100)
}
