package pubsub_test

import (
	"context"
	"errors"
	"testing"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/relaybus/relaybus/internal/pubsubtest"
	"github.com/relaybus/relaybus/shared/broker"
	"github.com/relaybus/relaybus/shared/broker/pubsub"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/topology"
)

// failKey fails every publish request that carries a given ordering key.
type failKey struct{ key string }

func (f failKey) React(req any) (bool, any, error) {
	for _, m := range req.(*pb.PublishRequest).Messages {
		if m.OrderingKey == f.key {
			return true, nil, status.Error(codes.PermissionDenied, "injected")
		}
	}
	return false, nil, nil
}

func TestPublishResumesAFailedKey(t *testing.T) {
	ctx := context.Background()
	react := &failKey{key: "bad"}
	fake := pubsubtest.New(t, pstest.ServerReactorOption{FuncName: "Publish", Reactor: react})
	top, err := topology.Load("")
	if err != nil {
		t.Fatal(err)
	}
	fake.Provision(t, top)
	msg := func(key string) event.Message { return event.Message{Data: []byte("x"), OrderingKey: key} }

	if _, err := fake.Client.Publish(ctx, "shop.order.events", msg("bad")); err == nil {
		t.Fatal("injected failure not reported")
	}
	if _, err := fake.Client.Publish(ctx, "shop.order.events", msg("good")); err != nil {
		t.Fatalf("another key was blocked: %v", err)
	}
	react.key = ""
	id, err := fake.Client.Publish(ctx, "shop.order.events", msg("bad"))
	if err != nil || id == "" {
		t.Fatalf("key not resumed after its failure: %q %v", id, err)
	}
}

func TestPublishAsyncLeavesAFailedKeyPausedUntilResume(t *testing.T) {
	ctx := context.Background()
	react := &failKey{key: "k"}
	fake := pubsubtest.New(t, pstest.ServerReactorOption{FuncName: "Publish", Reactor: react})
	top, _ := topology.Load("")
	fake.Provision(t, top)
	m := event.Message{Data: []byte("x"), OrderingKey: "k"}
	if _, err := fake.Client.PublishAsync(ctx, "shop.order.events", m).Get(ctx); err == nil {
		t.Fatal("no failure")
	}
	react.key = ""
	_, err := fake.Client.PublishAsync(ctx, "shop.order.events", m).Get(ctx)
	if !pubsub.IsPaused(err) {
		t.Fatalf("key not paused after a failure: %v", err)
	}
	fake.Client.Resume("shop.order.events", "k")
	if _, err := fake.Client.PublishAsync(ctx, "shop.order.events", m).Get(ctx); err != nil {
		t.Fatalf("after Resume: %v", err)
	}
	if err := fake.Client.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := fake.Client.Publish(ctx, "shop.order.events", m); !errors.Is(err, pubsub.ErrClosed) {
		t.Fatalf("publish after Close: %v", err)
	}
}

func TestProvisionIsIdempotentAndFollowsTheTopology(t *testing.T) {
	ctx := context.Background()
	fake := pubsubtest.New(t)
	top, _ := topology.Load("")
	c := pubsub.Wrap(fake.Client.PubSub(), pubsub.Options{Provision: pubsub.ProvisionOptions{DeadLetterPolicy: true}})
	for i := 0; i < 2; i++ {
		if err := c.Provision(ctx, top); err != nil {
			t.Fatal(err)
		}
	}
	sub, err := fake.Client.PubSub().SubscriptionAdminClient.GetSubscription(ctx, &pb.GetSubscriptionRequest{
		Subscription: "projects/" + pubsubtest.Project + "/subscriptions/shop.order.events.member-service-processor"})
	if err != nil {
		t.Fatal(err)
	}
	if !sub.EnableMessageOrdering || sub.AckDeadlineSeconds != 60 || sub.Filter == "" || !sub.RetainAckedMessages ||
		sub.DeadLetterPolicy.GetMaxDeliveryAttempts() != 5 || sub.RetryPolicy.GetMinimumBackoff().AsDuration().Seconds() != 10 {
		t.Errorf("subscription not as the topology says: %+v", sub)
	}
	for _, id := range []string{"shop.order.events.dlq", "relaybus.ledger.rollup"} {
		if _, err := fake.Client.PubSub().TopicAdminClient.GetTopic(ctx, &pb.GetTopicRequest{Topic: "projects/" + pubsubtest.Project + "/topics/" + id}); err != nil {
			t.Errorf("topic %s: %v", id, err)
		}
	}
}

// TestCreatedSubscriptionsNeverExpire: a subscription made at run time
// (the operators' forwarders) has the spec's settings and an expiration
// policy without a TTL: with none, Pub/Sub applies its default and deletes
// a subscription after 31 days without activity, so a forwarder on a
// quiet topic would vanish.
func TestCreatedSubscriptionsNeverExpire(t *testing.T) {
	ctx := context.Background()
	fake := pubsubtest.New(t)
	top, _ := topology.Load("")
	fake.Provision(t, top)
	spec := broker.SubscriptionSpec{Name: "shop.order.events.crm-webhook-forwarder", Topic: "shop.order.events", Ordered: true,
		AckDeadline: 60 * time.Second, DeadLetterTopic: "shop.order.events.dlq", MaxDeliveryAttempts: 5, Retention: time.Hour,
		Push: broker.PushEndpoint{URL: "https://relaybus-forwarders.example.com/crm-webhook", ServiceAccount: "relaybus-fwd-push@p.iam.gserviceaccount.com",
			Audience: "https://relaybus-forwarders.example.com"}}
	if err := fake.Client.CreateSubscription(ctx, spec); err != nil {
		t.Fatal(err)
	}
	sub, err := fake.Client.PubSub().SubscriptionAdminClient.GetSubscription(ctx, &pb.GetSubscriptionRequest{
		Subscription: "projects/" + pubsubtest.Project + "/subscriptions/" + spec.Name})
	if err != nil {
		t.Fatal(err)
	}
	if sub.ExpirationPolicy == nil || sub.ExpirationPolicy.Ttl != nil {
		t.Errorf("expiration policy %v, want one without a TTL (never expires)", sub.ExpirationPolicy)
	}
	if !sub.EnableMessageOrdering || sub.GetDeadLetterPolicy().GetDeadLetterTopic() != "projects/"+pubsubtest.Project+"/topics/shop.order.events.dlq" ||
		sub.GetPushConfig().GetOidcToken().GetServiceAccountEmail() != spec.Push.ServiceAccount || !sub.RetainAckedMessages {
		t.Errorf("subscription not as specified: %+v", sub)
	}
}
