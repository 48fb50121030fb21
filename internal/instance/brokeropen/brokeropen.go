// Package brokeropen is the host's broker opener: the transport of the
// delivery paths (publish, relay, consume, dlqreplay), Pub/Sub or NATS
// JetStream as TRANSPORT names (instance.PubSub). It is a package of its
// own so that a binary whose function talks to no broker (rollup, which
// Pub/Sub pushes its notices to over HTTP) links neither client; a binary
// that does links both, since TRANSPORT is read when it starts.
package brokeropen

import (
	"context"
	"fmt"

	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/internal/instance/natsopen"
	"github.com/relaybus/relaybus/shared/broker"
	"github.com/relaybus/relaybus/shared/broker/pubsub"
)

// Open connects to the broker p.Transport names: Pub/Sub for project (the
// emulator at p.EmulatorHost when set, else Google's endpoint), or the
// NATS server at p.NATSURL (with p.NATSCreds). A bad TRANSPORT, or TRANSPORT=nats without
// NATS_URL, is an error naming the variable.
func Open(ctx context.Context, p instance.PubSub, project string) (broker.Broker, error) {
	switch p.Transport {
	case instance.TransportPubSub, "":
		c, err := PubSub(ctx, p, project)
		if err != nil {
			return nil, err // not a nil *pubsub.Client in a non-nil broker.Broker
		}
		return c, nil
	case instance.TransportNATS:
		c, err := natsopen.Open(ctx, p, project)
		if err != nil {
			return nil, err
		}
		return c, nil
	}
	return nil, fmt.Errorf("config: TRANSPORT=%q: want %s or %s", p.Transport, instance.TransportPubSub, instance.TransportNATS)
}

// PubSub connects to Pub/Sub for project, whatever p.Transport says: the
// emulator at p.EmulatorHost when set, else Google's endpoint.
func PubSub(ctx context.Context, p instance.PubSub, project string) (*pubsub.Client, error) {
	if p.EmulatorHost != "" {
		return pubsub.Dial(ctx, project, p.EmulatorHost, pubsub.Options{})
	}
	return pubsub.New(ctx, project, pubsub.Options{})
}
