package consume

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/cloudevent"
	"github.com/relaybus/relaybus/internal/eventually"
	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/shared/broker/brokertest/natstest"
	"github.com/relaybus/relaybus/shared/broker/nats"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/topology"
)

// CONSUMER_MODE=pull on TRANSPORT=nats: consume, built by its one Build,
// pulls its subscription from an embedded JetStream server, applies every
// event in its inbox once, acknowledges after the commit, and at Close
// drains the worker so nothing is left unacknowledged.
func TestPullModeOnNATS(t *testing.T) {
	ctx := context.Background()
	pool, schema := pgtest.SchemaConfig(t, nil)
	url := natstest.Server(t)
	top, err := topology.Load("")
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(ctx, url, nats.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := nc.Provision(ctx, top); err != nil {
		t.Fatal(err)
	}
	const topic, sub = "member.points.events", "member.points.events.audit-service-recorder"

	cfg := instance.Defaults[Config]()
	cfg.ProjectID = fmt.Sprintf("consume-pull-%d", time.Now().UnixNano())
	cfg.DB.URL = pgtest.SchemaURL(t, schema)
	cfg.Ledger.Mode = "off"
	cfg.ConsumerID, cfg.Subscription, cfg.Handler = "audit-service", sub, "projection"
	cfg.Mode = ModePull
	cfg.PubSub.Transport, cfg.PubSub.NATSURL = instance.TransportNATS, url
	fn, err := Build(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			_ = fn.Close(ctx)
		}
	}()

	var msgs []event.Message
	for v := int64(1); v <= 5; v++ {
		e := &event.Event{Type: "points.added", Source: "member-service", Topic: topic, AggregateID: "m-1",
			Version: v, Payload: []byte(fmt.Sprintf(`{"balance":%d}`, v*10))}
		if err := e.Prepare(time.Now(), event.Limits{}); err != nil {
			t.Fatal(err)
		}
		m, err := cloudevent.Encode(e, event.EncodingJSON)
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, m)
	}
	msgs = append(msgs, msgs[2]) // a republish: the stream drops it (Nats-Msg-Id)
	if n, err := nc.PublishBatch(ctx, topic, msgs); err != nil || n != len(msgs) {
		t.Fatalf("PublishBatch = %d, %v", n, err)
	}

	var applied int
	eventually.Within(30*time.Second, func() bool {
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM relaybus_inbox WHERE consumer_id = 'audit-service'`).Scan(&applied); err != nil {
			t.Fatal(err)
		}
		return applied == 5
	})
	if applied != 5 {
		t.Fatalf("%d events applied by the pull worker, want 5", applied)
	}

	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	closed = true
	if err := fn.Close(cctx); err != nil {
		t.Fatalf("Close (drain): %v", err)
	}
	cons, err := nc.JetStream().Consumer(ctx, nats.StreamName(topic), nats.ConsumerName(sub))
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.NumAckPending != 0 || info.NumPending != 0 || info.Delivered.Stream != 5 {
		t.Errorf("after the drain: %d unacknowledged, %d undelivered, last delivered stream seq %d; want 0, 0, 5",
			info.NumAckPending, info.NumPending, info.Delivered.Stream)
	}
}

func TestPullModeConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		mode, sub, want string
	}{
		{"stream", "s", `config: CONSUMER_MODE="stream": want push or pull`},
		{ModePull, "", "config: CONSUMER_SUBSCRIPTION is required with CONSUMER_MODE=pull"},
		{"inflight", "s", "config: CONSUMER_MAX_IN_FLIGHT=-1: must be 0 (no bound) or more"},
		{"rate", "s", "config: CONSUMER_MAX_PER_SECOND=-2: must be 0 (no limit) or more"},
		{"wait", "s", "config: CONSUMER_FLOW_WAIT=-1s: must be above 0"},
	} {
		cfg := instance.Defaults[Config]()
		cfg.ConsumerID, cfg.Subscription, cfg.Mode = "audit-service", tc.sub, tc.mode
		switch tc.mode { // the flow-control cases, in push mode
		case "inflight":
			cfg.Mode, cfg.MaxInFlight = ModePush, -1
		case "rate":
			cfg.Mode, cfg.MaxPerSecond = ModePush, -2
		case "wait":
			cfg.Mode, cfg.FlowWait = ModePush, -time.Second
		}
		if _, err := Build(context.Background(), cfg); err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("mode %q: %v; want %q", tc.mode, err, tc.want)
		}
	}
}
