package consume_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relaybus/relaybus/functions/consume"
	"github.com/relaybus/relaybus/internal/cloudevent"
	"github.com/relaybus/relaybus/internal/devstack"
	"github.com/relaybus/relaybus/internal/emulator"
	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/eventually"
	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/shared/broker/pubsub"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/topology"
)

// deadLetters counts the local delivery loop's dead letters (one WARN line
// each).
type deadLetters struct {
	slog.Handler
	n *atomic.Int64
}

func (h deadLetters) Handle(ctx context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, "local delivery: dead-lettered") {
		h.n.Add(1)
	}
	return h.Handler.Handle(ctx, r)
}

func (h deadLetters) WithAttrs(as []slog.Attr) slog.Handler {
	return deadLetters{h.Handler.WithAttrs(as), h.n}
}

func (h deadLetters) WithGroup(name string) slog.Handler {
	return deadLetters{h.Handler.WithGroup(name), h.n}
}

// The acceptance for a forward consumer delivered by Eventarc, on
// the Pub/Sub emulator and the local delivery loop standing in for the
// Eventarc trigger (binary messagePublished CloudEvents, no ordering, every
// answer but an acknowledgement counted, dead-lettered after 5 refused
// deliveries spaced by 1 s). consume (its one Build) forwards to a real
// HTTP target that is stopped for three times as long as the retries of
// one message last, with events published during the outage, then
// started again. The breaker opens after FORWARD_BREAKER_THRESHOLD failures
// and pauses the consumer by its own flag: every delivery is then kept in
// its database and acknowledged (200, code paused), no attempt spent. The
// Scheduler's POST /breaker:probe finds the target still down, then, once
// it is started, up: the flag is lifted and the kept deliveries published
// again, addressed to the consumer alone. Every event reaches the target
// and nothing is dead-lettered. Without the pause, the breaker's held
// answers (503) are refused deliveries, and the loop dead-letters the
// events within the outage, so the test fails.
func TestForwardOutageOverEventarcDeadLettersNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("an outage of several seconds")
	}
	ctx := context.Background()
	host := emutest.Host(t, emulator.PubSub)
	project := emutest.UniqueProject(t)
	pool, schema := pgtest.SchemaConfig(t, nil)
	tg := consume.NewOutageTarget(t)

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
        delivery: eventarc
        forward_url: http://%s/events
        forward_timeout_seconds: 2
        min_backoff_seconds: 1
        max_backoff_seconds: 1
        max_delivery_attempts: %d
`, topic, tg.Addr(), maxAttempts), 0o644); err != nil {
		t.Fatal(err)
	}
	top, err := topology.Load(topo)
	if err != nil {
		t.Fatal(err)
	}
	ps, err := pubsub.Dial(ctx, project, host, pubsub.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ps.Close()
	if err := ps.Provision(ctx, top); err != nil {
		t.Fatal(err)
	}

	cfg := instance.Defaults[consume.Config]()
	cfg.ProjectID = project
	cfg.Topology = topo
	cfg.DB.URL = pgtest.SchemaURL(t, schema)
	cfg.Ledger.Mode = "off"
	cfg.PubSub.EmulatorHost = host
	cfg.ConsumerID, cfg.Subscription, cfg.Handler = "archive-service", sub, "forward"
	cfg.ForwardURL, cfg.ForwardTimeout = "http://"+tg.Addr()+"/events", 2*time.Second
	cfg.MaxDeliveryAttempts = maxAttempts
	cfg.ForwardBreakerThreshold = 2
	cfg.ForwardBreakerCoolDown = time.Second
	cfg.ForwardBreakerMaxCoolDown = 2 * time.Second
	fn, err := consume.Build(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(fn)
	defer srv.Close()
	defer func() { _ = fn.Close(ctx) }()

	// The Eventarc trigger: the loop pulls the consumer's subscription and
	// posts each message to consume as Eventarc does.
	var dead atomic.Int64
	loop := &devstack.Loop{Client: ps, Project: project,
		Logger: slog.New(deadLetters{slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}), &dead})}
	lctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		loop.Run(lctx, []devstack.Route{{Subscription: sub, Topic: topic, URL: srv.URL + "/", Mode: topology.DeliveryEventarc,
			MinBackoff: backoff, MaxBackoff: backoff, MaxAttempts: maxAttempts}})
	}()
	defer func() { stop(); <-done }()

	const versions = 6
	var want []string
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
				want = append(want, e.ID)
				msgs = append(msgs, m)
			}
		}
		if n, err := ps.PublishBatch(ctx, topic, msgs); err != nil || n != len(msgs) {
			t.Fatalf("PublishBatch = %d, %v", n, err)
		}
	}
	type report struct {
		Paused      bool       `json:"paused"`
		PausedBy    string     `json:"pausedBy"`
		Probed      bool       `json:"probed"`
		NextProbe   *time.Time `json:"nextProbe"`
		Republished int        `json:"republished"`
		Done        string     `json:"done"`
	}
	probe := func() report {
		t.Helper()
		resp, err := http.Post(srv.URL+"/breaker:probe", "application/json", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var rep report
		if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil || resp.StatusCode != 200 {
			t.Fatalf("POST /breaker:probe: %d, %v", resp.StatusCode, err)
		}
		return rep
	}
	count := func(q string) int {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, q).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	publish(1, 1)
	eventually.True(t, 60*time.Second, "the first two events forwarded", func() bool { return len(tg.Accepted()) >= 2 })
	if rep := probe(); rep.Paused || rep.Probed {
		t.Fatalf("probe while the target is up: %+v, want not paused, not probed", rep)
	}

	tg.Stop()
	publish(2, versions)
	eventually.True(t, 60*time.Second, "the breaker pauses the consumer by its flag", func() bool {
		return count(`SELECT count(*) FROM relaybus_inbox_pause WHERE consumer_id = 'archive-service' AND breaker`) == 1
	})
	// The outage: three times as long as the retries of one message last
	// when each is counted. Its length is the test's subject, not a wait
	// for something to happen.
	outage := 3 * maxAttempts * backoff
	time.Sleep(outage)
	if rep := probe(); !rep.Paused || rep.PausedBy != "breaker" || !rep.Probed || rep.NextProbe == nil {
		t.Fatalf("probe while the target is down: %+v, want paused by the breaker, probed, a next probe", rep)
	}
	if n := count(`SELECT count(*) FROM relaybus_inbox_held WHERE consumer_id = 'archive-service'`); n == 0 {
		t.Fatal("no delivery kept while the breaker paused the consumer")
	}

	tg.Start(t)
	// The Scheduler's job, until the cool-down has passed and the probe
	// finds the target up.
	republished := 0
	eventually.True(t, 30*time.Second, "the probe resumes the consumer", func() bool {
		rep := probe()
		republished += rep.Republished
		return !rep.Paused
	})
	if republished == 0 {
		t.Error("the resume published no kept delivery again")
	}

	// Eventarc delivery is unordered: every event arrives, in any order.
	eventually.True(t, 90*time.Second, "every event forwarded after the outage", func() bool {
		seen := map[string]bool{}
		for _, id := range tg.Accepted() {
			seen[id] = true
		}
		for _, id := range want {
			if !seen[id] {
				return false
			}
		}
		return true
	})
	if n := dead.Load(); n != 0 {
		t.Errorf("after a %s outage: %d messages dead-lettered; want none", outage, n)
	}
	if n := count(`SELECT count(*) FROM relaybus_inbox_held WHERE consumer_id = 'archive-service'`); n != 0 {
		t.Errorf("%d deliveries still kept after the resume", n)
	}
	t.Logf("outage %s: %d deliveries republished, %d requests accepted by the target for %d events", outage, republished, len(tg.Accepted()), len(want))
}
