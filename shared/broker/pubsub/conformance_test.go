package pubsub_test

import (
	"context"
	"os"
	"testing"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/relaybus/relaybus/internal/emulator"
	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/names"
	"github.com/relaybus/relaybus/internal/topology"
	"github.com/relaybus/relaybus/shared/broker/brokertest"
	"github.com/relaybus/relaybus/shared/broker/pubsub"
)

// TestMain stops the Pub/Sub emulator emutest started, if it started one.
func TestMain(m *testing.M) {
	code := m.Run()
	emutest.Cleanup()
	os.Exit(code)
}

// TestConformance runs the transport suite against Pub/Sub on pstest.
func TestConformance(t *testing.T) {
	srv := pstest.NewServer()
	t.Cleanup(func() { _ = srv.Close() })
	brokertest.Run(t, pubsubBackend("relaybus-conformance", srv.Addr, true))
}

// TestConformanceOnTheEmulator runs the transport suite against the gcloud
// Pub/Sub emulator (make test's, or one started for the test binary): a
// server of Google's own besides the client library's fake.
func TestConformanceOnTheEmulator(t *testing.T) {
	if testing.Short() {
		t.Skip("the suite waits out ack deadlines on the emulator")
	}
	// The emulator (cloud-pubsub-emulator 0.8.20, the SDK's) accepts a
	// subscription's filter and does not apply it: a replay addressed to
	// one consumer reaches every subscription, as on NATS, and the other
	// consumers' engines skip it. Pub/Sub and pstest apply it
	// (https://cloud.google.com/pubsub/docs/subscription-message-filter).
	brokertest.Run(t, pubsubBackend(emutest.UniqueProject(t), emutest.Host(t, emulator.PubSub), false))
}

// pubsubBackend is the suite's Pub/Sub backend on the server at addr;
// filters says whether that server applies subscription filters.
func pubsubBackend(project, addr string, filters bool) brokertest.Backend {
	const ackDeadline = 10 * time.Second // Pub/Sub's minimum
	path := func(kind, id string) string { return "projects/" + project + "/" + kind + "/" + id }
	return brokertest.Backend{
		Open: func(t *testing.T) brokertest.Broker {
			c, err := pubsub.Dial(context.Background(), project, addr, pubsub.Options{})
			if err != nil {
				t.Fatal(err)
			}
			return c
		},
		Setup: func(t *testing.T, b brokertest.Broker, topic, sub, dlqSub string) {
			admin := b.(*pubsub.Client).PubSub()
			ctx := context.Background()
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
		Subscribe: func(t *testing.T, b brokertest.Broker, topic, consumer string) string {
			c := topology.Consumer{Topic: topic, Service: consumer, Role: "processor"}
			_, err := b.(*pubsub.Client).PubSub().SubscriptionAdminClient.CreateSubscription(context.Background(), &pb.Subscription{
				Name: path("subscriptions", c.Subscription()), Topic: path("topics", topic),
				EnableMessageOrdering: true, AckDeadlineSeconds: int32(ackDeadline / time.Second), Filter: c.Filter(),
			})
			if err != nil {
				t.Fatal(err)
			}
			return c.Subscription()
		},
		AckDeadline: ackDeadline,
		// No publish deduplication on Pub/Sub: a repeated publish is a
		// second message (https://cloud.google.com/pubsub/docs/exactly-once-delivery
		// is about delivery, not publishing); the inbox absorbs it. Delivery
		// attempts are counted only with a dead-letter policy, which pstest
		// does not run.
		Caps: brokertest.Capabilities{DedupOnEventID: false, DeliveryAttemptCount: false, FiltersByTarget: filters},
	}
}
