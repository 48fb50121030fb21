package natsjs_test

import (
	"context"
	"testing"
	"time"

	"github.com/relaybus/relaybus/shared/names"
	"github.com/relaybus/relaybus/shared/relay"
	"github.com/relaybus/relaybus/shared/transport/natsjs"
	"github.com/relaybus/relaybus/shared/transport/natsjs/natstest"
	"github.com/relaybus/relaybus/shared/transport/transporttest"
)

// The relay publishes through it.
var _ relay.Publisher = (*natsjs.Client)(nil)

// TestConformance runs the transport suite against an embedded JetStream
// server.
func TestConformance(t *testing.T) {
	url := natstest.Server(t)
	const ackWait = 2 * time.Second
	transporttest.Run(t, transporttest.Backend{
		Open: func(t *testing.T) transporttest.Broker {
			c, err := natsjs.Connect(context.Background(), url, natsjs.Options{PullWait: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			return c
		},
		Setup: func(t *testing.T, b transporttest.Broker, topic, sub, dlqSub string) {
			c := b.(*natsjs.Client)
			ctx := context.Background()
			for _, tp := range []string{topic, names.DeadLetter(topic)} {
				if err := c.EnsureTopic(ctx, tp, 0); err != nil {
					t.Fatal(err)
				}
			}
			if err := c.EnsureSubscription(ctx, topic, sub, natsjs.SubscriptionConfig{AckWait: ackWait}); err != nil {
				t.Fatal(err)
			}
			if err := c.EnsureSubscription(ctx, names.DeadLetter(topic), dlqSub, natsjs.SubscriptionConfig{AckWait: ackWait}); err != nil {
				t.Fatal(err)
			}
		},
		AckDeadline: ackWait,
		Caps:        transporttest.Capabilities{DedupOnEventID: true, DeliveryAttemptCount: true},
	})
}

func TestKeyToken(t *testing.T) {
	for _, tc := range []struct{ key, want string }{
		{"order-1", "order-1"},
		{"a_b", "a_b"},
		{"", "~"},
		{"a.b", "~YS5i"},
		{"*", "~Kg"},
		{"~x", "~fng"},
	} {
		if got := natsjs.KeyToken(tc.key); got != tc.want {
			t.Errorf("KeyToken(%q) = %q, want %q", tc.key, got, tc.want)
		}
	}
}
