package devstack

import (
	"context"
	"log/slog"
	"time"

	"github.com/relaybus/relaybus/internal/names"
	"github.com/relaybus/relaybus/shared/broker"
	"github.com/relaybus/relaybus/shared/topology"
)

// standIn stands in for push and Eventarc: on a broker with push
// subscriptions, the delivery loop pulls them and POSTs what push would
// (Loop); on one without (NATS JetStream), the consumers pull for
// themselves and bridges pull the rollup and DLQ-monitor subscriptions
// and POST what they pull (runBridges).
type standIn struct {
	// loop is the push stand-in (nil without push). It also pauses and
	// resumes consumers for the operations API, so it is made before the
	// functions and run after them.
	loop   *Loop
	broker broker.Broker
	// routes are what it delivers, set once the functions are mounted.
	routes  []Route
	project string
	log     *slog.Logger
}

// newDelivery is the stand-in for br's push, not running yet.
func newDelivery(br brokerClient, wake *Wakeup, o Options) *standIn {
	d := &standIn{broker: br.Broker, project: o.Project, log: o.Logger}
	if br.Pushes {
		d.loop = &Loop{Client: br.PubSub, Project: o.Project, BackoffScale: o.BackoffScale, Wakeup: wake, Logger: o.Logger}
	}
	return d
}

// route sets what d delivers: each pushed consumer (the subscription's
// retry policy, scaled by BackoffScale), each topic's DLQ monitor to the
// operations API's archive, and the rollup subscription to rollup.
func (d *standIn) route(base string, top *topology.Topology, consumers []mountedConsumer, backoffScale float64) {
	var routes []Route
	if d.loop != nil {
		for _, c := range consumers {
			// A consumer's max_in_flight bounds its route as Cloud Run's
			// container concurrency bounds its pushes (0: the loop's).
			routes = append(routes, Route{Subscription: c.Subscription(), Topic: c.Topic, URL: c.URL + "/", Mode: c.Delivery,
				MaxAttempts: c.MaxDeliveryAttempts, MaxInFlight: c.MaxInFlight})
		}
	}
	for _, t := range top.Topics {
		routes = append(routes, Route{Subscription: names.DeadLetterMonitor(t.Name), Topic: names.DeadLetter(t.Name),
			URL: base + "/dlqreplay/deadletters:archive", Mode: topology.DeliveryPush})
	}
	routes = append(routes, Route{Subscription: broker.RollupSubscription(top), Topic: top.Rollup.Topic, URL: base + "/rollup/",
		Mode: topology.DeliveryPush, MaxInFlight: rollupMaxInFlight})
	if d.loop == nil {
		// The bridges' backoff: the Pub/Sub subscriptions' retry policies
		// (pubsub.Client.Provision), scaled as the loop scales them.
		scaled := func(d time.Duration) time.Duration { return time.Duration(float64(d) * backoffScale) }
		for i := range routes {
			routes[i].MinBackoff, routes[i].MaxBackoff = scaled(NoPolicyBackoff), scaled(NoPolicyBackoff)
			if routes[i].Topic == top.Rollup.Topic {
				routes[i].MinBackoff, routes[i].MaxBackoff = scaled(time.Second), scaled(time.Minute)
			}
		}
	}
	d.routes = routes
}

// run delivers until ctx ends, then drains: what is in flight finishes,
// the rest is handed back (the loop's account of it is returned).
func (d *standIn) run(ctx context.Context) Stopped {
	if d.loop == nil {
		runBridges(ctx, d.broker, d.project, d.routes, d.log)
		return Stopped{}
	}
	return d.loop.Run(ctx, d.routes)
}

// rollupMaxInFlight is the delivery loop's bound on rollup notices in
// flight. Rollup holds a notice until every consumer its events expect has
// reported, at most ROLLUP_WINDOW (5 s), so the loop's 64 carried about
// 64/hold notices a second: at 50 purchases/s the notices queued behind
// the held ones and the ledger fell a minute and more behind (lag p50
// 14-44 s, p99 77-110 s on a quiet machine); at 512 it was 1.0 s, 1.2 s.
// Pub/Sub's push has no such small bound: it "dynamically adjusts the rate
// of push requests based on the rate at which it receives success
// responses" (https://cloud.google.com/pubsub/docs/push), and Cloud Run
// adds instances.
const rollupMaxInFlight = 1024
