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
	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/shared/broker"
	"github.com/relaybus/relaybus/shared/broker/pubsub"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/topology"
)

// The acceptance over ordered push, on the Pub/Sub emulator, which
// pushes to consume and counts every delivery not acknowledged toward the
// subscription's dead-letter policy (5 attempts, 1 s backoff): consume
// (its one Build) forwards to a real HTTP target that is stopped for three
// times as long as Pub/Sub's retries of one message last, with events
// published during the outage, then started again. The breaker opens
// after FORWARD_BREAKER_THRESHOLD failures and pauses the subscription
// (its push endpoint detached), so Pub/Sub delivers and counts nothing;
// the Scheduler's POST /breaker:probe finds the target still down, then,
// once it is started, up, and sets the endpoint back: every event is
// delivered, in order per aggregate, and nothing is dead-lettered. Without
// the pause, the held answers (503) are counted and Pub/Sub gives up on
// the oldest events within the outage (the emulator, at
// max_delivery_attempts, stops delivering a message rather than publish
// it to the dead-letter topic: an event the target never gets is one
// Pub/Sub gave up on), so the test fails.
func TestForwardOutageOverPushDeadLettersNothing(t *testing.T) {
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
		sub         = "shop.order.events.archive-service-forwarder"
		maxAttempts = 5
		backoff     = time.Second // min_backoff_seconds = max_backoff_seconds
	)
	topo := filepath.Join(t.TempDir(), "topology.yaml")
	if err := os.WriteFile(topo, fmt.Appendf(nil, `
rollup: {topic: relaybus.ledger.rollup}
topics:
  - name: %s
    consumers:
      - service: archive-service
        role: forwarder
        handler: forward
        delivery: push
        forward_url: http://%s/events
        forward_timeout_seconds: 2
        min_backoff_seconds: 1
        max_backoff_seconds: 1
        max_delivery_attempts: %d
`, topic, tg.addr, maxAttempts), 0o644); err != nil {
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
	cfg.ConsumerID, cfg.Subscription, cfg.Handler = "archive-service", sub, "forward"
	cfg.ForwardURL, cfg.ForwardTimeout = "http://"+tg.addr+"/events", 2*time.Second
	cfg.MaxDeliveryAttempts = maxAttempts
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
	// As Terraform creates it: an ordered push subscription to consume.
	endpoint := broker.PushEndpoint{URL: srv.URL + "/", ServiceAccount: "consume@example.iam.gserviceaccount.com", Audience: srv.URL}
	if _, err := ps.SetPushEndpoint(ctx, sub, endpoint); err != nil {
		t.Fatal(err)
	}
	pushing := func() string {
		e, err := ps.PushEndpoint(ctx, sub)
		if err != nil {
			t.Fatal(err)
		}
		return e.URL
	}

	const versions = 6
	want := map[string][]string{} // aggregate → event ids in version order
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
	probe := func() probeReport {
		t.Helper()
		resp, err := http.Post(srv.URL+"/breaker:probe", "application/json", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var rep probeReport
		if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil || resp.StatusCode != 200 {
			t.Fatalf("POST /breaker:probe: %d, %v", resp.StatusCode, err)
		}
		return rep
	}

	publish(1, 1)
	eventually.True(t, 60*time.Second, "the first two events forwarded", func() bool { return len(tg.accepted()) >= 2 })
	if rep := probe(); rep.Paused || rep.Probed {
		t.Fatalf("probe while the target is up: %+v, want not paused, not probed", rep)
	}

	tg.stop()
	publish(2, versions)
	eventually.True(t, 60*time.Second, "the breaker pauses the push subscription", func() bool { return pushing() == "" })
	// The outage: three times as long as Pub/Sub's retries of one message
	// last when each is counted. Its length is the test's subject, not a
	// wait for something to happen.
	outage := 3 * maxAttempts * backoff
	time.Sleep(outage)
	if rep := probe(); !rep.Paused || rep.PausedBy != "breaker" || !rep.Probed || rep.NextProbe == nil {
		t.Fatalf("probe while the target is down: %+v, want paused by the breaker, probed, a next probe", rep)
	}
	if got := pushing(); got != "" {
		t.Fatalf("after a failed probe the subscription pushes to %q", got)
	}

	tg.start(t)
	// The Scheduler's job, until the cool-down has passed and the probe
	// finds the target up.
	eventually.True(t, 30*time.Second, "the probe resumes the subscription", func() bool { return !probe().Paused })
	if got := pushing(); got != endpoint.URL {
		t.Fatalf("resumed, the subscription pushes to %q, want %q", got, endpoint.URL)
	}

	tg.forwardedInOrder(t, 90*time.Second, want)

	var deadLettered int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM relaybus_attempts WHERE consumer_id = 'archive-service' AND outcome = 'dead_lettered'`).Scan(&deadLettered); err != nil {
		t.Fatal(err)
	}
	if deadLettered != 0 {
		t.Errorf("after a %s outage: %d attempts recorded dead_lettered; want none", outage, deadLettered)
	}
	t.Logf("outage %s: %d requests accepted by the target for %d events", outage, len(tg.accepted()), 2*versions)
}
