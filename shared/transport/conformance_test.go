package transport_test

import (
	"context"
	"testing"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/relaybus/relaybus/shared/names"
	"github.com/relaybus/relaybus/shared/transport"
	"github.com/relaybus/relaybus/shared/transport/transporttest"
)

// TestConformance runs the transport suite against Pub/Sub on pstest.
func TestConformance(t *testing.T) {
	const project = "relaybus-conformance"
	srv := pstest.NewServer()
	t.Cleanup(func() { _ = srv.Close() })
	const ackDeadline = 10 * time.Second // Pub/Sub's minimum
	transporttest.Run(t, transporttest.Backend{
		Open: func(t *testing.T) transporttest.Broker {
			c, err := transport.Dial(context.Background(), project, srv.Addr, transport.Options{})
			if err != nil {
				t.Fatal(err)
			}
			return c
		},
		Setup: func(t *testing.T, b transporttest.Broker, topic, sub, dlqSub string) {
			admin := b.(*transport.Client).PubSub()
			ctx := context.Background()
			path := func(kind, id string) string { return "projects/" + project + "/" + kind + "/" + id }
			for _, tp := range []string{topic, names.DeadLetter(topic)} {
				if _, err := admin.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: path("topics", tp)}); err != nil {
					t.Fatal(err)
				}
			}
			for _, s := range [][2]string{{sub, topic}, {dlqSub, names.DeadLetter(topic)}} {
				if _, err := admin.SubscriptionAdminClient.CreateSubscription(ctx, &pb.Subscription{
					Name: path("subscriptions", s[0]), Topic: path("topics", s[1]), EnableMessageOrdering: true,
					AckDeadlineSeconds: int32(ackDeadline / time.Second),
					RetryPolicy:        &pb.RetryPolicy{MinimumBackoff: durationpb.New(time.Second)},
				}); err != nil {
					t.Fatal(err)
				}
			}
		},
		AckDeadline: ackDeadline,
		// No publish deduplication on Pub/Sub: a repeated publish is a
		// second message (https://cloud.google.com/pubsub/docs/exactly-once-delivery
		// is about delivery, not publishing); the inbox absorbs it. Delivery
		// attempts are counted only with a dead-letter policy, which pstest
		// does not run.
		Caps: transporttest.Capabilities{DedupOnEventID: false, DeliveryAttemptCount: false},
	})
}
