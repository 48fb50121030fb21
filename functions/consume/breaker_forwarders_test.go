package consume

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/cloudevent"
	"github.com/relaybus/relaybus/internal/emulator"
	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/eventually"
	"github.com/relaybus/relaybus/internal/forwarders"
	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/shared/broker"
	"github.com/relaybus/relaybus/shared/broker/pubsub"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/topology"
)

// The acceptance for a forwarder added at run time, on the Pub/Sub
// emulator: the forwarders service (CONSUMER_HANDLER=forwarders, its one
// Build) serves a forwarder whose subscription is created as the
// operators' API creates it (ordered, pushed to the service under the
// forwarder's name, the topology's 5 attempts and 1 s backoff, a
// dead-letter policy). Its target is stopped for three times as long as
// Pub/Sub's retries of one message last, with events published during the
// outage, then started again. The forwarder's breaker opens after
// FORWARD_BREAKER_THRESHOLD failures and detaches its subscription's push
// endpoint (recorded as the breaker's), so Pub/Sub delivers and counts
// nothing and keeps the messages in order; the service's POST
// /breaker:probe finds the target still down, then up, and sets the
// endpoint back: every event arrives, in order per aggregate, nothing
// dead-lettered. Without the pause, Pub/Sub counts the held answers and
// gives up on the oldest events within the outage (the emulator stops
// delivering a message at max_delivery_attempts), so the test fails.
func TestForwarderOutageDeadLettersNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("an outage of several seconds")
	}
	ctx := context.Background()
	host := emutest.Host(t, emulator.PubSub)
	project := emutest.UniqueProject(t)
	pool, schema := pgtest.SchemaConfig(t, nil)
	tg := newOutageTarget(t)

	const (
		topic       = "shop.order.events"
		name        = "archive-hook"
		maxAttempts = 5
		backoff     = time.Second
	)
	topo := filepath.Join(t.TempDir(), "topology.yaml")
	if err := os.WriteFile(topo, fmt.Appendf(nil, `
rollup: {topic: relaybus.ledger.rollup}
defaults:
  min_backoff_seconds: 1
  max_backoff_seconds: 1
  max_delivery_attempts: %d
topics:
  - name: %s
    consumers:
      - service: order-projection
        delivery: eventarc
`, maxAttempts, topic), 0o644); err != nil {
		t.Fatal(err)
	}
	top, err := topology.Load(topo)
	if err != nil {
		t.Fatal(err)
	}
	ps, err := pubsub.Dial(ctx, project, host, pubsub.Options{Provision: pubsub.ProvisionOptions{DeadLetterPolicy: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer ps.Close()
	if err := ps.Provision(ctx, top); err != nil {
		t.Fatal(err)
	}

	cfg := instance.Defaults[Config]()
	cfg.ProjectID = project
	cfg.Topology = topo
	cfg.DB.URL = pgtest.SchemaURL(t, schema)
	cfg.Ledger.Mode = "off"
	cfg.PubSub.EmulatorHost = host
	cfg.ConsumerID, cfg.Handler = "forwarders", HandlerForwarders
	cfg.ForwardTimeout = 2 * time.Second
	cfg.ForwardBreakerThreshold = 2
	cfg.ForwardBreakerCoolDown = time.Second
	cfg.ForwardBreakerMaxCoolDown = 2 * time.Second
	fn, err := Build(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(fn)
	defer srv.Close()
	defer func() { _ = fn.Close(ctx) }()

	// The forwarder as the operators' API adds it (functions/dlqreplay's
	// forwarders.go): its registry row, then its subscription.
	f, err := forwarders.Add(ctx, pool, forwarders.Forwarder{Name: name, Topic: topic, URL: "http://" + tg.addr + "/events",
		Auth: topology.ForwardAuthNone, TimeoutSeconds: 2}, "test")
	if err != nil {
		t.Fatal(err)
	}
	c := f.Consumer(top)
	endpoint := broker.PushEndpoint{URL: srv.URL + "/" + name, ServiceAccount: "forwarders@example.iam.gserviceaccount.com", Audience: srv.URL}
	if err := ps.CreateSubscription(ctx, broker.SubscriptionSpec{Name: f.Subscription(), Topic: topic, Filter: c.Filter(), Ordered: true,
		AckDeadline: time.Duration(c.AckDeadlineSeconds) * time.Second, MinBackoff: backoff, MaxBackoff: backoff,
		DeadLetterTopic: c.DeadLetterTopic(), MaxDeliveryAttempts: maxAttempts, Push: endpoint}); err != nil {
		t.Fatal(err)
	}
	pushing := func() string {
		e, err := ps.PushEndpoint(ctx, f.Subscription())
		if err != nil {
			t.Fatal(err)
		}
		return e.URL
	}

	const versions = 6
	want := map[string][]string{}
	publish := func(from, to int64) {
		t.Helper()
		var msgs []event.Message
		for v := from; v <= to; v++ {
			for _, agg := range []string{"o-1", "o-2"} {
				e := &event.Event{Type: "order.updated", Source: "order-service", Topic: topic, AggregateID: agg,
					AggregateType: "order", Version: v, Payload: fmt.Appendf(nil, `{"v":%d}`, v)}
				if err := e.Prepare(time.Now(), event.Limits{}); err != nil {
					t.Fatal(err)
				}
				m, err := cloudevent.Encode(e, event.EncodingJSON)
				if err != nil {
					t.Fatal(err)
				}
				want[agg] = append(want[agg], e.ID)
				msgs = append(msgs, m)
			}
		}
		if n, err := ps.PublishBatch(ctx, topic, msgs); err != nil || n != len(msgs) {
			t.Fatalf("PublishBatch = %d, %v", n, err)
		}
	}
	probe := func() forwarderProbe {
		t.Helper()
		resp, err := http.Post(srv.URL+"/breaker:probe", "application/json", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var rep struct {
			Forwarders []forwarderProbe `json:"forwarders"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil || resp.StatusCode != 200 || len(rep.Forwarders) != 1 {
			t.Fatalf("POST /breaker:probe: %d, %v, %+v; want one forwarder's report", resp.StatusCode, err, rep)
		}
		return rep.Forwarders[0]
	}

	publish(1, 1)
	eventually.True(t, 60*time.Second, "the first two events forwarded", func() bool { return len(tg.accepted()) >= 2 })
	if rep := probe(); rep.Forwarder != name || rep.Paused || rep.Probed {
		t.Fatalf("probe while the target is up: %+v, want %s not paused, not probed", rep, name)
	}

	tg.stop()
	publish(2, versions)
	eventually.True(t, 60*time.Second, "the forwarder's breaker pauses its subscription", func() bool { return pushing() == "" })
	outage := 3 * maxAttempts * backoff // the test's subject, not a wait
	time.Sleep(outage)
	if rep := probe(); !rep.Paused || rep.PausedBy != "breaker" || !rep.Probed || rep.NextProbe == nil {
		t.Fatalf("probe while the target is down: %+v, want paused by the breaker, probed, a next probe", rep)
	}
	if got := pushing(); got != "" {
		t.Fatalf("after a failed probe the subscription pushes to %q", got)
	}

	tg.start(t)
	eventually.True(t, 30*time.Second, "the probe resumes the forwarder", func() bool { return !probe().Paused })
	if got, _ := ps.PushEndpoint(ctx, f.Subscription()); got != endpoint {
		t.Fatalf("resumed, the subscription pushes as %+v, want %+v", got, endpoint)
	}

	tg.forwardedInOrder(t, 90*time.Second, want)
	var deadLettered int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM relaybus_attempts WHERE consumer_id = $1 AND outcome = 'dead_lettered'`, name).Scan(&deadLettered); err != nil {
		t.Fatal(err)
	}
	if deadLettered != 0 {
		t.Errorf("after a %s outage: %d attempts recorded dead_lettered; want none", outage, deadLettered)
	}
	t.Logf("outage %s: %d requests accepted by the target for %d events", outage, len(tg.accepted()), 2*versions)
}
