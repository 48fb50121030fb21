package dlqreplay_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/internal/archive"
	"github.com/relaybus/relaybus/internal/deadletter"
	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/eventually"
	"github.com/relaybus/relaybus/internal/ledger"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/shared/broker/brokertest/natstest"
	"github.com/relaybus/relaybus/shared/broker/nats"
	"github.com/relaybus/relaybus/shared/event"
)

// On NATS, nothing pushes: the deployed operations API (ARCHIVE_MODE=pull)
// provisions the topology's streams and pulls every topic's DLQ monitor
// itself, so a message a consumer dead-lettered lands in the archive.
func TestArchivePullModeOnNATSArchivesTheDeadLetters(t *testing.T) {
	ctx := context.Background()
	project := emutest.FirestoreProject(t)
	url := natstest.Server(t)
	t.Setenv("GOOGLE_CLOUD_PROJECT", project)
	t.Setenv("DATABASE_URL", pgtest.URL(t))
	t.Setenv("TRANSPORT", "nats")
	t.Setenv("NATS_URL", url)
	t.Setenv("ARCHIVE_MODE", "pull")
	t.Setenv("DLQREPLAY_AUTH", dlqreplay.AuthNone)
	cfg, err := dlqreplay.LoadConfig(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fn, err := dlqreplay.Build(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer fn.Close(ctx)
	nc, err := nats.Connect(ctx, url, nats.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	dl := deadletter.PubSub(orderMessage("evt-nats-dead"), project, "shop.order.events.member-service-processor", 5)
	dl.OrderingKey = "order-1"
	if _, err := nc.PublishBatch(ctx, "shop.order.events.dlq", []event.Message{dl}); err != nil {
		t.Fatal(err)
	}
	store, err := ledger.Open(ctx, ledger.Config{ProjectID: project}, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	letters := archive.New(store.Client())
	var got []archive.Letter
	eventually.True(t, 30*time.Second, "the dead letter in the archive", func() bool {
		got, _, _ = letters.List(ctx, archive.Filter{EventID: "evt-nats-dead"}, 10, "")
		return len(got) == 1
	})
	if l := got[0]; l.DeadLetterTopic != "shop.order.events.dlq" || l.Consumer != "member-service" || l.EventType != "order.purchased" {
		t.Errorf("archived %s of %s (%s), want the shop.order.events.dlq letter of member-service", l.DeadLetterTopic, l.Consumer, l.EventType)
	}
}

// ARCHIVE_MODE=pull needs a broker to pull from that does not push.
func TestArchivePullModeNeedsNATS(t *testing.T) {
	t.Setenv("TRANSPORT", "pubsub")
	t.Setenv("ARCHIVE_MODE", "pull")
	cfg, err := dlqreplay.LoadConfig(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dlqreplay.Build(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "ARCHIVE_MODE=pull needs TRANSPORT=nats") {
		t.Errorf("Build: %v, want ARCHIVE_MODE=pull refused on Pub/Sub", err)
	}
}
