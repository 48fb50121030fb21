package relay_test

import (
	"fmt"
	"testing"

	"github.com/relaybus/relaybus/internal/benchcheck"
	"github.com/relaybus/relaybus/internal/telemetry"
	"github.com/relaybus/relaybus/internal/telemetrytest"
)

// overheadRounds is how many pairs (off, on) an overhead benchmark runs.
const overheadRounds = 3

// BenchmarkDrainTelemetryOverhead drains the same outbox (100,000 events
// on 500 aggregates) with telemetry off and on (the default sampling,
// exports discarded), interleaved off, on, off, on, off, on, and reports
// the median of the rounds' throughput lost: relay_telemetry_overhead_pct.
func BenchmarkDrainTelemetryOverhead(b *testing.B) {
	for range b.N {
		b.StopTimer()
		events := benchEvents(100_000)
		var off, on []float64
		var durable, pubsub string
		for range overheadRounds {
			off = append(off, drainBench(b, events, 500).rate)
			stop := telemetrytest.On(telemetry.DefaultSampleRatio)
			r := drainBench(b, events, 500)
			stop()
			on = append(on, r.rate)
			durable, pubsub = r.durable, r.pubsub
		}
		benchcheck.Overhead(b, "relay_telemetry_overhead_pct",
			fmt.Sprintf("relay_events_per_s with telemetry off → on (sampling %g at the root, batching span processor and metrics in process, exports discarded; rows enqueued without a producer span), %d events on 500 aggregates per drain; Postgres %s; %s",
				telemetry.DefaultSampleRatio, events, durable, pubsub), off, on, true)
	}
}
