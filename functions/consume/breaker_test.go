package consume

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
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

// outageTarget is a forward target on a fixed loopback address that can
// be stopped (connections refused) and started again. It records the
// event ids it accepted, in the order it accepted them.
type outageTarget struct {
	addr string
	mu   sync.Mutex
	got  []string
	srv  *http.Server
}

func newOutageTarget(t *testing.T) *outageTarget {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tg := &outageTarget{addr: ln.Addr().String()}
	tg.serve(ln)
	t.Cleanup(tg.stop)
	return tg
}

func (tg *outageTarget) serve(ln net.Listener) {
	tg.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tg.mu.Lock()
		tg.got = append(tg.got, r.Header.Get("Ce-Id"))
		tg.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = tg.srv.Serve(ln) }()
}

// stop closes the listener: connections are refused until start.
func (tg *outageTarget) stop() { _ = tg.srv.Close() }

func (tg *outageTarget) start(t *testing.T) {
	ln, err := net.Listen("tcp", tg.addr)
	if err != nil {
		t.Fatalf("restart the target on %s: %v", tg.addr, err)
	}
	tg.serve(ln)
}

func (tg *outageTarget) accepted() []string {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	return append([]string(nil), tg.got...)
}

// The acceptance: a target outage dead-letters nothing, however
// long it lasts. consume (its one Build, CONSUMER_MODE=pull on an
// embedded JetStream) forwards to a real HTTP target that is stopped
// (connection refused) for an outage three times as long as the
// subscription's retries last (max_delivery_attempts × max_backoff), and
// started again. Without the breaker the events are dead-lettered within
// that time; with it, the breaker opens after FORWARD_BREAKER_THRESHOLD
// failures, holds the deliveries without counting them, probes, and once
// the target answers every event is delivered, in order per aggregate,
// and nothing is dead-lettered.
func TestForwardOutageDeadLettersNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("an outage of several seconds")
	}
	ctx := context.Background()
	pool, schema := pgtest.SchemaConfig(t, nil)
	url := natstest.Server(t)
	tg := newOutageTarget(t)

	const (
		topic       = "shop.order.events"
		sub         = "shop.order.events.archive-service-forwarder"
		maxAttempts = 5
		backoff     = time.Second // min_backoff_seconds = max_backoff_seconds
	)
	dir := t.TempDir()
	topo := filepath.Join(dir, "topology.yaml")
	if err := os.WriteFile(topo, fmt.Appendf(nil, `
rollup: {topic: relaybus.ledger.rollup}
topics:
  - name: %s
    consumers:
      - service: archive-service
        role: forwarder
        handler: forward
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
	nc, err := nats.Connect(ctx, url, nats.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := nc.Provision(ctx, top); err != nil {
		t.Fatal(err)
	}

	cfg := instance.Defaults[Config]()
	cfg.ProjectID = fmt.Sprintf("consume-breaker-%d", time.Now().UnixNano())
	cfg.Topology = topo
	cfg.DB.URL = pgtest.SchemaURL(t, schema)
	cfg.Ledger.Mode = "off"
	cfg.ConsumerID, cfg.Subscription, cfg.Handler = "archive-service", sub, "forward"
	cfg.ForwardURL, cfg.ForwardTimeout = "http://"+tg.addr+"/events", 2*time.Second
	cfg.MaxDeliveryAttempts = maxAttempts
	cfg.ForwardBreakerThreshold = 3
	cfg.ForwardBreakerCoolDown = 100 * time.Millisecond
	cfg.ForwardBreakerMaxCoolDown = 500 * time.Millisecond
	cfg.Mode = ModePull
	cfg.PubSub.Transport, cfg.PubSub.NATSURL = instance.TransportNATS, url
	fn, err := Build(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = fn.Close(ctx) }()

	// Versions 1..n of two orders; version 1 of each goes while the
	// target is up, the rest during the outage.
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
		if n, err := nc.PublishBatch(ctx, topic, msgs); err != nil || n != len(msgs) {
			t.Fatalf("PublishBatch = %d, %v", n, err)
		}
	}
	publish(1, 1)
	eventually.True(t, 30*time.Second, "the first two events forwarded", func() bool { return len(tg.accepted()) >= 2 })

	tg.stop()
	publish(2, versions)
	// The outage: three times as long as the subscription's retries of
	// one message last without the breaker. Its length is the test's
	// subject, not a wait for something to happen.
	outage := 3 * maxAttempts * backoff
	time.Sleep(outage)
	tg.start(t)

	tg.forwardedInOrder(t, 60*time.Second, want)

	var deadLettered, failed int
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE outcome = 'dead_lettered'), count(*) FILTER (WHERE outcome <> 'success')
		FROM relaybus_attempts WHERE consumer_id = 'archive-service'`).Scan(&deadLettered, &failed); err != nil {
		t.Fatal(err)
	}
	dlq, err := nc.JetStream().Stream(ctx, nats.StreamName(topic+".dlq"))
	if err != nil {
		t.Fatal(err)
	}
	info, err := dlq.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if deadLettered != 0 || info.State.Msgs != 0 {
		t.Errorf("after a %s outage: %d attempts recorded dead_lettered, %d messages on %s.dlq; want none", outage, deadLettered, info.State.Msgs, topic)
	}
	// Only the failures before the breaker opened are attempts: fewer
	// than the threshold, however long the outage.
	if failed >= cfg.ForwardBreakerThreshold {
		t.Errorf("%d failed attempts recorded during the outage; want fewer than the threshold (%d)", failed, cfg.ForwardBreakerThreshold)
	}
	t.Logf("outage %s: %d failed attempts recorded, %d requests accepted by the target for %d events", outage, failed, len(tg.accepted()), 2*versions)
}

// forwardedInOrder waits up to timeout for the target to accept every event
// of want (aggregate → event ids in version order), then checks that each
// event's first acceptance came after its predecessor's.
func (tg *outageTarget) forwardedInOrder(t *testing.T, timeout time.Duration, want map[string][]string) {
	t.Helper()
	all := func() bool {
		seen := map[string]bool{}
		for _, id := range tg.accepted() {
			seen[id] = true
		}
		for _, ids := range want {
			for _, id := range ids {
				if !seen[id] {
					return false
				}
			}
		}
		return true
	}
	eventually.True(t, timeout, "every event forwarded after the outage", all)
	first := map[string]int{}
	for i, id := range tg.accepted() {
		if _, ok := first[id]; !ok {
			first[id] = i
		}
	}
	for agg, ids := range want {
		for i := 1; i < len(ids); i++ {
			if first[ids[i]] < first[ids[i-1]] {
				t.Errorf("%s: version %d was forwarded before version %d", agg, i+1, i)
			}
		}
	}
}
