package relay_test

import (
	"flag"

	"github.com/relaybus/relaybus/shared/relay"
)

// The drain benchmarks' parameters, for exploring the relay's tuning
// (go test -bench Drain ./shared/relay -args -relay.batch=1000 ...); make
// bench runs the defaults.
var (
	benchBroker  = flag.String("relay.pubsub", "pstest", "the drain benchmarks' broker: pstest (in a process of its own) or emulator (the gcloud Pub/Sub emulator PUBSUB_EMULATOR_HOST names, or one started)")
	benchBatch   = flag.Int("relay.batch", 0, "the drain benchmarks' Options.BatchSize (0: the default)")
	benchConc    = flag.Int("relay.concurrency", 0, "the drain benchmarks' Options.Concurrency (0: the default)")
	benchAggs    = flag.Int("relay.aggregates", 0, "the drain benchmarks' Options.Aggregates (0: the default)")
	benchRun     = flag.Int("relay.run", 0, "the drain benchmarks' Options.RunLimit (0: the default)")
	benchEventsN = flag.Int("relay.events", 0, "the events a drain benchmark queues (0: its own number)")
)

// benchTuning sets the options the flags name.
func benchTuning(o *relay.Options) {
	for _, f := range []struct {
		flag int
		opt  *int
	}{{*benchBatch, &o.BatchSize}, {*benchConc, &o.Concurrency}, {*benchAggs, &o.Aggregates}, {*benchRun, &o.RunLimit}} {
		if f.flag > 0 {
			*f.opt = f.flag
		}
	}
}
