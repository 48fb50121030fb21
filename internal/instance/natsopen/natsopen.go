// Package natsopen is the host's NATS JetStream opener, with TRANSPORT=nats:
// brokeropen opens it for the delivery paths, and rollup, which takes its
// notices over HTTP on Pub/Sub and pulls them on NATS, opens it alone, so
// its binary links no Pub/Sub client.
package natsopen

import (
	"context"
	"errors"

	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/shared/broker/nats"
)

// Open connects to the NATS server at p.NATSURL with p.NATSCreds' credentials
// (none when empty), naming the connection name. A missing NATS_URL is an
// error naming the variable.
func Open(ctx context.Context, p instance.PubSub, name string) (*nats.Client, error) {
	if p.NATSURL == "" {
		return nil, errors.New("config: NATS_URL is required with TRANSPORT=nats: the NATS server's URL, e.g. nats://127.0.0.1:4222")
	}
	return nats.Connect(ctx, p.NATSURL, nats.Options{Name: name, CredsFile: p.NATSCreds})
}
