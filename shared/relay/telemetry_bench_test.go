package relay_test

import (
	"fmt"
	"testing"

	"github.com/relaybus/relaybus/internal/telemetrytest"
	"github.com/relaybus/relaybus/shared/telemetry"
)

// BenchmarkDrainTelemetryOverhead drains the same outbox (100,000 events
// on 500 aggregates) with telemetry off and on (the default sampling,
// exports discarded), alternating off/on twice, and reports the best rate
// of each and the throughput lost: relay_telemetry_overhead_pct.
func BenchmarkDrainTelemetryOverhead(b *testing.B) {
	for range b.N {
		b.StopTimer()
		events := benchEvents(100_000)
		var best [2]float64
		var durable, pubsub string
		for round := range 4 {
			on := round%2 == 1
			var off func()
			if on {
				off = telemetrytest.On(telemetry.DefaultSampleRatio)
			}
			r := drainBench(b, events, 500)
			if on {
				off()
			}
			i := 0
			if on {
				i = 1
			}
			best[i] = max(best[i], r.rate)
			durable, pubsub = r.durable, r.pubsub
		}
		fmt.Printf("# relay telemetry overhead: %d events on 500 aggregates drained 4 times (off, on, off, on; best of each), telemetry on = sampling %g at the root, "+
			"batching span processor and metrics in process, exports discarded; rows enqueued without a producer span; Postgres %s; %s\n",
			events, telemetry.DefaultSampleRatio, durable, pubsub)
		fmt.Printf("# relay_events_per_s telemetry off %.0f ev/s, on %.0f ev/s, ratio on/off %.3f\n", best[0], best[1], best[1]/best[0])
		fmt.Printf("BENCH relay_telemetry_overhead_pct %.1f %%\n", (best[0]-best[1])/best[0]*100)
	}
}
