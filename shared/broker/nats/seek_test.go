package nats_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/relaybus/relaybus/shared/broker"
	"github.com/relaybus/relaybus/shared/broker/brokertest/natstest"
	"github.com/relaybus/relaybus/shared/broker/nats"
	"github.com/relaybus/relaybus/shared/event"
)

// SeekTime does what Pub/Sub's Seek to a time does: after every message
// was acknowledged, the ones stored at or after the time are delivered
// again, in order, and the ones before it are not; the consumer keeps its
// name and its other settings, pullers keep pulling it, and provisioning
// it again afterwards (a restart) keeps the seek instead of failing on
// JetStream's "deliver policy can not be updated".
func TestSeekTimeRedeliversFromTheTime(t *testing.T) {
	ctx := context.Background()
	c := connectWithTopic(t, natstest.Server(t), 500*time.Millisecond)
	const topic, sub = orderTopic, orderSub
	sc := nats.SubscriptionConfig{AckWait: 7 * time.Second}
	if err := c.EnsureSubscription(ctx, topic, sub, sc); err != nil {
		t.Fatal(err)
	}
	publish := func(ids ...string) {
		for _, id := range ids {
			if _, err := c.Publish(ctx, topic, event.Message{Data: []byte(id), OrderingKey: "order-1",
				Attributes: map[string]string{event.AttrEventID: id}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// pullAll acknowledges everything it gets until a pull comes back empty.
	pullAll := func() []string {
		var got []string
		for {
			ls, err := c.Pull(ctx, sub, 10)
			if err != nil {
				t.Fatal(err)
			}
			if len(ls) == 0 {
				return got
			}
			for _, l := range ls {
				got = append(got, string(l.Message().Data))
				if err := l.Ack(ctx); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	publish("e1", "e2")
	if got := pullAll(); !slices.Equal(got, []string{"e1", "e2"}) {
		t.Fatalf("first delivery %v, want [e1 e2]", got)
	}
	stream, err := c.JetStream().Stream(ctx, nats.StreamName(topic))
	if err != nil {
		t.Fatal(err)
	}
	m2, err := stream.GetMsg(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	publish("e3", "e4")
	if got := pullAll(); !slices.Equal(got, []string{"e3", "e4"}) {
		t.Fatalf("second delivery %v, want [e3 e4]", got)
	}
	// The stream's timestamps are the server's clock: the seek time is
	// taken from the stored e2, just after it (e3 was stored later).
	at := m2.Time.Add(time.Nanosecond)
	if err := c.SeekTime(ctx, sub, at); err != nil {
		t.Fatal(err)
	}
	if got := pullAll(); !slices.Equal(got, []string{"e3", "e4"}) {
		t.Errorf("after the seek to just after e2: %v, want [e3 e4] again", got)
	}
	if got := pullAll(); len(got) != 0 {
		t.Errorf("after the redelivery: %v more", got)
	}
	cons, err := c.JetStream().Consumer(ctx, nats.StreamName(topic), nats.ConsumerName(sub))
	if err != nil {
		t.Fatal(err)
	}
	info := cons.CachedInfo()
	if info.Config.AckWait != sc.AckWait || info.Config.AckPolicy != jetstream.AckExplicitPolicy || info.Config.DeliverPolicy != jetstream.DeliverByStartTimePolicy {
		t.Errorf("the recreated consumer: ack wait %v, ack policy %v, deliver policy %v; want %v, explicit, by start time",
			info.Config.AckWait, info.Config.AckPolicy, info.Config.DeliverPolicy, sc.AckWait)
	}
	// Provisioned again, as at the next start: no error, the seek kept,
	// and nothing delivered again.
	if err := c.EnsureSubscription(ctx, topic, sub, sc); err != nil {
		t.Fatalf("EnsureSubscription after a seek: %v", err)
	}
	publish("e5")
	if got := pullAll(); !slices.Equal(got, []string{"e5"}) {
		t.Errorf("after provisioning again: %v, want [e5]", got)
	}
	const none = "shop.order.events.nobody-processor"
	if err := c.SeekTime(ctx, none, at); err == nil || !strings.Contains(err.Error(), none) {
		t.Errorf("SeekTime of a subscription that does not exist: %v; want an error naming it", err)
	}
}

// A seek of a subscription that does not exist is the broker contract's
// ErrNotFound (dlqreplay answers it 404, as on Pub/Sub), not an error
// only the NATS client can read.
func TestSeekTimeOfAnUnknownSubscriptionIsNotFound(t *testing.T) {
	ctx := context.Background()
	c := connectWithTopic(t, natstest.Server(t), 500*time.Millisecond)
	err := c.SeekTime(ctx, orderTopic+".nobody-processor", time.Now())
	if !errors.Is(err, broker.ErrNotFound) {
		t.Fatalf("SeekTime of an unknown subscription = %v, want broker.ErrNotFound", err)
	}
	if !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("the error %q does not say the subscription does not exist", err)
	}
}
