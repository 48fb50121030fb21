package natsjs_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/names"
	"github.com/relaybus/relaybus/shared/relay"
	"github.com/relaybus/relaybus/shared/topology"
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
		Subscribe: func(t *testing.T, b transporttest.Broker, topic, consumer string) string {
			sub := topology.Consumer{Topic: topic, Service: consumer, Role: "processor"}.Subscription()
			if err := b.(*natsjs.Client).EnsureSubscription(context.Background(), topic, sub, natsjs.SubscriptionConfig{AckWait: ackWait}); err != nil {
				t.Fatal(err)
			}
			return sub
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

// Message ids are unique across streams (a stream sequence alone is not:
// the first dead letters of two topics were both "1" and the DLQ archive,
// keyed by message id, kept only one), and a pulled message carries the
// id its Publish returned.
func TestMessageIDsAreUniqueAcrossStreams(t *testing.T) {
	ctx := context.Background()
	c, err := natsjs.Connect(ctx, natstest.Server(t), natsjs.Options{PullWait: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	published := map[string]string{}
	for _, topic := range []string{"shop.order.events.dlq", "member.points.events.dlq"} {
		sub := names.DeadLetterMonitor(strings.TrimSuffix(topic, names.DeadLetterSuffix))
		if err := c.EnsureTopic(ctx, topic, 0); err != nil {
			t.Fatal(err)
		}
		if err := c.EnsureSubscription(ctx, topic, sub, natsjs.SubscriptionConfig{}); err != nil {
			t.Fatal(err)
		}
		id, err := c.Publish(ctx, topic, event.Message{Data: []byte("x"), Attributes: map[string]string{event.AttrEventID: "e-1"}})
		if err != nil {
			t.Fatal(err)
		}
		if other, dup := published[id]; dup {
			t.Fatalf("message id %s on %s and on %s", id, topic, other)
		}
		published[id] = topic
		ls, err := c.Pull(ctx, sub, 1)
		if err != nil || len(ls) != 1 {
			t.Fatalf("pull %s: %d messages, %v", sub, len(ls), err)
		}
		if got := ls[0].Message().ID; got != id {
			t.Errorf("%s: pulled message id %s, Publish returned %s", topic, got, id)
		}
	}
}
