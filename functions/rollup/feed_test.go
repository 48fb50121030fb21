package rollup

import (
	"context"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/firestore"

	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/eventually"
	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/internal/ledger"
	"github.com/relaybus/relaybus/internal/ledger/consumers"
	"github.com/relaybus/relaybus/internal/ledger/model"
	"github.com/relaybus/relaybus/internal/ledger/query"
	"github.com/relaybus/relaybus/internal/registry"
	"github.com/relaybus/relaybus/shared/broker/brokertest/natstest"
	"github.com/relaybus/relaybus/shared/broker/nats"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/topology"
)

// On NATS, nothing pushes: the deployed rollup (ROLLUP_MODE=pull) provisions
// the topology's streams and pulls its notices itself, and an attempt
// notice a consumer published reaches the ledger. After Close, the feed
// has stopped: a notice published then waits in the stream, and the next
// instance rolls it up.
func TestPullModeOnNATSRollsUpTheNoticesItPulls(t *testing.T) {
	ctx := context.Background()
	project := emutest.FirestoreProject(t)
	url := natstest.Server(t)
	t.Setenv("GOOGLE_CLOUD_PROJECT", project)
	t.Setenv("TRANSPORT", "nats")
	t.Setenv("NATS_URL", url)
	t.Setenv("ROLLUP_MODE", "pull")
	cfg, err := instance.Load[Config](ctx)
	if err != nil {
		t.Fatal(err)
	}
	h, err := Build(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	top, err := topology.Load(cfg.Topology)
	if err != nil {
		t.Fatal(err)
	}
	fs, err := firestore.NewClientWithDatabase(ctx, project, ledger.DefaultDatabase)
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	if _, err := consumers.New(fs, consumers.Options{}).SyncConsumers(ctx, []registry.Consumer{
		{Topic: topic, ConsumerID: "member-service", Enabled: true, SortOrder: 1},
		{Topic: topic, ConsumerID: "message-service", Enabled: true, SortOrder: 2},
	}, consumers.SyncOptions{}); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(ctx, url, nats.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	publish := func(e *event.Event) {
		t.Helper()
		at := time.Now().UTC()
		m := model.FoldMessage([]model.Attempt{
			{EventID: e.ID, ConsumerID: "member-service", AttemptNo: 1, Success: true, Outcome: model.OutcomeSuccess, ConsumedAt: at, MessageID: "m-" + e.ID, Topic: topic},
			{EventID: e.ID, ConsumerID: "message-service", AttemptNo: 1, Success: true, Outcome: model.OutcomeSuccess, ConsumedAt: at, MessageID: "m-" + e.ID, Topic: topic},
		})
		m.OrderingKey = e.ID
		if _, err := nc.PublishBatch(ctx, top.Rollup.Topic, []event.Message{m}); err != nil {
			t.Fatal(err)
		}
	}
	status := func(id string) model.Status {
		d, err := query.New(fs).Get(ctx, id)
		if err != nil {
			return ""
		}
		return d.Event.Status
	}
	first := newEvent(t)
	publish(first)
	eventually.True(t, 30*time.Second, "the pulled notice's event CONSUMED in the ledger", func() bool { return status(first.ID) == model.StatusConsumed })
	if err := h.Close(ctx); err != nil {
		t.Fatal(err)
	}
	second := newEvent(t)
	publish(second)
	// The next instance takes up what the stream kept.
	h2, err := Build(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer h2.Close(ctx)
	eventually.True(t, 30*time.Second, "the notice published between instances CONSUMED", func() bool { return status(second.ID) == model.StatusConsumed })
}

// A mode the function cannot run is refused at build, naming the variable.
func TestBuildRefusesAModeItCannotRun(t *testing.T) {
	project := emutest.FirestoreProject(t)
	for _, c := range []struct {
		mode, transport, want string
	}{
		{"pull", "pubsub", "ROLLUP_MODE=pull needs TRANSPORT=nats"},
		{"stream", "nats", `ROLLUP_MODE="stream": want push or pull`},
	} {
		t.Run(c.mode+"-"+c.transport, func(t *testing.T) {
			t.Setenv("GOOGLE_CLOUD_PROJECT", project)
			t.Setenv("TRANSPORT", c.transport)
			t.Setenv("ROLLUP_MODE", c.mode)
			cfg, err := instance.Load[Config](context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if _, err := Build(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Build: %v, want an error saying %q", err, c.want)
			}
		})
	}
}
