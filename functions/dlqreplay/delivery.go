package dlqreplay

import (
	"log/slog"
	"time"

	"github.com/relaybus/relaybus/shared/broker"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/topology"
)

// deliveryControl serves what changes how messages reach a consumer, each
// in its own file: pausing and resuming a consumer (pause.go),
// seeking a subscription and its snapshots (seek.go), rebuilding a
// projection (rebuild.go: pause, clear, seek, resume), and a strict
// consumer's version gaps (gaps.go).
type deliveryControl struct {
	// broker is asked for its capabilities (broker.As): TimeSeeker,
	// Snapshotter. Nil: seek and snapshots answer 501.
	broker broker.Broker
	// pauser pauses and resumes push consumers (nil: 501).
	pauser Pauser
	// topology declares the consumers (nil: none is known), subs maps
	// their logical subscriptions to the real ones, pull lists those
	// deployed in pull mode.
	topology *topology.Topology
	subs     *topology.SubscriptionMap
	pull     pullSet
	// dbs are the consumers' databases: a strict consumer's gaps and a
	// rebuild's clearing are done in them.
	dbs    databases
	g      *guard
	logger *slog.Logger
	// publisher publishes again what a consumer kept while paused by its
	// flag; pauseSettle is how long such a pause takes to reach every
	// consume instance (Options.PauseSettle).
	publisher   event.Publisher
	pauseSettle time.Duration
	// forwarders finds the forwarders added at run time, which are paused
	// like declared push consumers (nil: none).
	forwarders *forwarderAPI
}
