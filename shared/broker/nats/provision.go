package nats

import (
	"context"
	"time"

	"github.com/relaybus/relaybus/internal/names"
	"github.com/relaybus/relaybus/shared/broker"
	"github.com/relaybus/relaybus/shared/topology"
)

// Provision is the broker contract's provisioning (broker.Provisioner): it
// creates on the server what the Pub/Sub driver's Provision creates on
// Pub/Sub for a topology: a stream per topic (its retention as MaxAge) and
// per <topic>.dlq, a durable pull consumer per consumer subscription (its
// ack deadline as AckWait), per <topic>.dlq-monitor and for the rollup.
// A consumer's max_in_flight bounds its consumer's MaxAckPending
// (MaxAckPending). Retry policies and dead-lettering are the pull worker's; replay filters
// are the engine's (a message addressed to another consumer is ignored).
// It is idempotent.
func (c *Client) Provision(ctx context.Context, t *topology.Topology) error {
	secs := func(s int) time.Duration { return time.Duration(s) * time.Second }
	if err := c.EnsureTopic(ctx, t.Rollup.Topic, 0); err != nil {
		return err
	}
	if err := c.EnsureSubscription(ctx, t.Rollup.Topic, broker.RollupSubscription(t),
		SubscriptionConfig{AckWait: secs(t.Defaults.AckDeadlineSeconds)}); err != nil {
		return err
	}
	for _, tp := range t.Topics {
		dlq := names.DeadLetter(tp.Name)
		for _, name := range []string{tp.Name, dlq} {
			if err := c.EnsureTopic(ctx, name, secs(tp.MessageRetentionSeconds)); err != nil {
				return err
			}
		}
		if err := c.EnsureSubscription(ctx, dlq, names.DeadLetterMonitor(tp.Name),
			SubscriptionConfig{AckWait: secs(t.Defaults.AckDeadlineSeconds)}); err != nil {
			return err
		}
		for _, cs := range tp.Consumers {
			if err := c.EnsureSubscription(ctx, tp.Name, cs.Subscription(), SubscriptionConfig{AckWait: secs(cs.AckDeadlineSeconds),
				MaxAckPending: MaxAckPending(cs)}); err != nil {
				return err
			}
		}
	}
	return nil
}

// MaxAckPending is the MaxAckPending Provision gives a topology consumer's
// durable consumer: its max_in_flight times its max_instances (1 when
// unset: one local process pulls it), the most deliveries all its
// instances may hold at once; DefaultMaxAckPending when max_in_flight is
// unset. JetStream has no per-consumer rate for pull consumers (its
// RateLimit is a push consumer's, in bits a second): max_per_second is
// the pull worker's (internal/flow).
func MaxAckPending(c topology.Consumer) int {
	if c.MaxInFlight <= 0 {
		return DefaultMaxAckPending
	}
	return c.MaxInFlight * max(c.MaxInstances, 1)
}
