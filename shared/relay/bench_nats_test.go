package relay_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/relaybus/relaybus/internal/benchcheck"
	"github.com/relaybus/relaybus/shared/broker/brokertest/natstest"
	"github.com/relaybus/relaybus/shared/broker/nats"
	"github.com/relaybus/relaybus/shared/relay"
	"github.com/relaybus/relaybus/shared/topology"
)

// benchNATS starts an embedded JetStream server (file storage, in this
// process) with one stream per topic, and connects the relay's client.
func benchNATS(b *testing.B, top *topology.Topology) (relay.Publisher, string) {
	b.Helper()
	ctx := context.Background()
	c, err := nats.Connect(ctx, natstest.Server(b), nats.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close() })
	for _, t := range top.Topics {
		if err := c.EnsureTopic(ctx, t.Name, 0); err != nil {
			b.Fatal(err)
		}
	}
	return c, "NATS JetStream embedded in the benchmark's process (file storage, Nats-Msg-Id dedup)"
}

// BenchmarkDrainNATS is BenchmarkDrain with NATS JetStream as the
// transport.
func BenchmarkDrainNATS(b *testing.B) {
	for range b.N {
		b.StopTimer()
		events := benchEvents(200_000)
		r := drainBench(b, events, 500, benchNATS)
		o := r.o
		fmt.Printf("# relay drain on NATS: %d events on 500 aggregates, %d-byte payloads, batch %d rows, %d aggregates and %d rows of each per claim, %d workers; Postgres %s; %s, streams only (no consumers), subject per ordering key\n",
			events, len(`{"n":1}`), o.BatchSize, o.Aggregates, o.RunLimit, o.Concurrency, r.durable, r.pubsub)
		benchcheck.Figure(b, "relay_events_per_s_nats", r.rate, "ev/s")
	}
}
