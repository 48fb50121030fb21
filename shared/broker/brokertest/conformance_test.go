package brokertest_test

import (
	"context"
	"os"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/pstest"

	"github.com/relaybus/relaybus/internal/emulator"
	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/shared/broker"
	"github.com/relaybus/relaybus/shared/broker/brokertest"
	"github.com/relaybus/relaybus/shared/broker/brokertest/natstest"
	"github.com/relaybus/relaybus/shared/broker/nats"
	"github.com/relaybus/relaybus/shared/broker/pubsub"
)

// TestMain stops the Pub/Sub emulator emutest started, if it started one.
func TestMain(m *testing.M) {
	code := m.Run()
	emutest.Cleanup()
	os.Exit(code)
}

// TestPubSubOnPstest runs the suite against the Pub/Sub driver on pstest.
func TestPubSubOnPstest(t *testing.T) {
	srv := pstest.NewServer()
	t.Cleanup(func() { _ = srv.Close() })
	brokertest.Run(t, pubsubBackend("relaybus-conformance", srv.Addr, true))
}

// TestPubSubOnTheEmulator runs the suite against the Pub/Sub driver on
// the gcloud Pub/Sub emulator (make test's, or one started for the test
// binary): a server of Google's own besides the client library's fake.
func TestPubSubOnTheEmulator(t *testing.T) {
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
	return brokertest.Backend{
		Open: func(t *testing.T) broker.Broker {
			c, err := pubsub.Dial(context.Background(), project, addr, pubsub.Options{})
			if err != nil {
				t.Fatal(err)
			}
			return c
		},
		AckDeadline: 10 * time.Second, // Pub/Sub's minimum
		// No publish deduplication on Pub/Sub: a repeated publish is a
		// second message (https://cloud.google.com/pubsub/docs/exactly-once-delivery
		// is about delivery, not publishing); the inbox absorbs it. Delivery
		// attempts are counted only with a dead-letter policy, which pstest
		// does not run.
		Caps: brokertest.Capabilities{DedupOnEventID: false, DeliveryAttemptCount: false, FiltersByTarget: filters},
	}
}

// TestNATSOnAnEmbeddedServer runs the suite against the NATS JetStream
// driver on an embedded server.
func TestNATSOnAnEmbeddedServer(t *testing.T) {
	url := natstest.Server(t)
	brokertest.Run(t, brokertest.Backend{
		Open: func(t *testing.T) broker.Broker {
			c, err := nats.Connect(context.Background(), url, nats.Options{PullWait: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			return c
		},
		AckDeadline: 2 * time.Second,
		Caps:        brokertest.Capabilities{DedupOnEventID: true, DeliveryAttemptCount: true},
	})
}
