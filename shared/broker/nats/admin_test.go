package nats_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/relaybus/relaybus/shared/broker"
	"github.com/relaybus/relaybus/shared/broker/brokertest/natstest"
	"github.com/relaybus/relaybus/shared/broker/nats"
	"github.com/relaybus/relaybus/shared/event"
)

// A subscription created at run time (broker.SubscriptionAdmin, found by
// broker.As) is a durable pull consumer that delivers what is published
// from then on, in order, and nothing stored before; a second one of the
// name is ErrExists; what JetStream cannot do (an attribute filter, a
// push endpoint) and a topic with no stream are ErrRefused with the
// reason; deleting it makes the consumer gone on the server, and a
// second delete is ErrNotFound.
func TestASubscriptionCreatedAtRunTimeDeliversWhatFollows(t *testing.T) {
	ctx := context.Background()
	c := connectWithTopic(t, natstest.Server(t), 300*time.Millisecond)
	admin, ok := broker.As[broker.SubscriptionAdmin](c)
	if !ok {
		t.Fatal("the NATS client is no broker.SubscriptionAdmin")
	}
	const sub = orderTopic + ".crm-webhook-forwarder"
	publish := func(ids ...string) {
		for _, id := range ids {
			if _, err := c.Publish(ctx, orderTopic, event.Message{Data: []byte(id), OrderingKey: "order-1",
				Attributes: map[string]string{event.AttrEventID: id}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	publish("before-1", "before-2")
	spec := broker.SubscriptionSpec{Name: sub, Topic: orderTopic, Ordered: true, AckDeadline: 9 * time.Second,
		MinBackoff: time.Second, MaxBackoff: time.Minute, MaxDeliveryAttempts: 5, DeadLetterTopic: orderTopic + ".dlq"}
	if err := admin.CreateSubscription(ctx, spec); err != nil {
		t.Fatal(err)
	}
	info, err := c.JetStream().Consumer(ctx, nats.StreamName(orderTopic), nats.ConsumerName(sub))
	if err != nil {
		t.Fatalf("the durable consumer: %v", err)
	}
	if cfg := info.CachedInfo().Config; cfg.AckWait != 9*time.Second || cfg.AckPolicy != jetstream.AckExplicitPolicy ||
		cfg.DeliverPolicy != jetstream.DeliverNewPolicy {
		t.Fatalf("the durable consumer's settings: %+v", cfg)
	}
	publish("after-1", "after-2", "after-3")
	var got []string
	for len(got) < 3 {
		ls, err := c.Pull(ctx, sub, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(ls) == 0 {
			break
		}
		for _, l := range ls {
			got = append(got, string(l.Message().Data))
			if err := l.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if strings.Join(got, ",") != "after-1,after-2,after-3" {
		t.Fatalf("the new subscription delivered %v, want what was published after it, in order", got)
	}

	for _, tc := range []struct {
		name string
		s    broker.SubscriptionSpec
		kind error
		say  string
	}{
		{"the same name", spec, broker.ErrExists, "exists"},
		{"a filter", broker.SubscriptionSpec{Name: orderTopic + ".b-forwarder", Topic: orderTopic, Filter: `attributes.event_type = "x"`}, broker.ErrRefused, "filter"},
		{"a push endpoint", broker.SubscriptionSpec{Name: orderTopic + ".c-forwarder", Topic: orderTopic, Push: broker.PushEndpoint{URL: "https://x.example.com/c"}}, broker.ErrRefused, "push"},
		{"a topic with no stream", broker.SubscriptionSpec{Name: "shop.cart.events.d-forwarder", Topic: "shop.cart.events"}, broker.ErrRefused, "provision"},
	} {
		err := admin.CreateSubscription(ctx, tc.s)
		if !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.say) {
			t.Errorf("create with %s: %v, want %v saying %q", tc.name, err, tc.kind, tc.say)
		}
	}
	for _, name := range []string{"b-forwarder", "c-forwarder"} {
		if _, err := c.JetStream().Consumer(ctx, nats.StreamName(orderTopic), nats.ConsumerName(orderTopic+"."+name)); !errors.Is(err, jetstream.ErrConsumerNotFound) {
			t.Errorf("a refused subscription left a consumer: %v", err)
		}
	}

	if err := admin.DeleteSubscription(ctx, sub); err != nil {
		t.Fatal(err)
	}
	if _, err := c.JetStream().Consumer(ctx, nats.StreamName(orderTopic), nats.ConsumerName(sub)); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Fatalf("after delete the durable consumer: %v, want not found", err)
	}
	if err := admin.DeleteSubscription(ctx, sub); !errors.Is(err, broker.ErrNotFound) {
		t.Fatalf("a second delete: %v, want ErrNotFound", err)
	}
}
