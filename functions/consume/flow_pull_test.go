package consume

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/cloudevent"
	"github.com/relaybus/relaybus/internal/eventually"
	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/shared/broker/brokertest/natstest"
	"github.com/relaybus/relaybus/shared/broker/nats"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/topology"
)

// flowHook is what the test.flow handler runs (set by each test).
var flowHook atomic.Pointer[func(ctx context.Context, c *consumer.Context) error]

func init() {
	RegisterHandler("test.flow", func(HandlerConfig) (consumer.Handler, error) {
		return consumer.HandlerFunc(func(ctx context.Context, c *consumer.Context) error {
			if f := flowHook.Load(); f != nil {
				return (*f)(ctx, c)
			}
			return nil
		}), nil
	})
}

const flowTopic, flowSub = "shop.order.events", "shop.order.events.flow-service-processor"

// pullFlowStack provisions limits (a consumer's flow fields, YAML) on an
// embedded JetStream server, builds consume in pull mode over it as
// Terraform configures an instance (CONSUMER_MAX_IN_FLIGHT,
// CONSUMER_MAX_PER_SECOND from the topology), publishes n events on
// distinct aggregates and returns the JetStream client and the time just
// before consume was built (its flow-control gate made).
func pullFlowStack(t *testing.T, limits string, n int, hook func(ctx context.Context, c *consumer.Context) error) (*nats.Client, time.Time) {
	t.Helper()
	ctx := context.Background()
	flowHook.Store(&hook)
	t.Cleanup(func() { flowHook.Store(nil) })
	_, schema := pgtest.SchemaConfig(t, nil)
	url := natstest.Server(t)
	path := filepath.Join(t.TempDir(), "topology.yaml")
	doc := fmt.Sprintf(`
rollup: {topic: relaybus.ledger.rollup}
topics:
  - name: %s
    consumers:
      - service: flow-service
        handler: test.flow
        %s
`, flowTopic, limits)
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	top, err := topology.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := top.Consumer(flowSub)
	nc, err := nats.Connect(ctx, url, nats.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	if err := nc.Provision(ctx, top); err != nil {
		t.Fatal(err)
	}

	cfg := instance.Defaults[Config]()
	cfg.Topology = path
	cfg.ProjectID = fmt.Sprintf("consume-flow-%d", time.Now().UnixNano())
	cfg.DB.URL = pgtest.SchemaURL(t, schema)
	cfg.Ledger.Mode = "off"
	cfg.ConsumerID, cfg.Subscription, cfg.Handler = c.Service, flowSub, c.Handler
	cfg.MaxInFlight, cfg.MaxPerSecond = c.MaxInFlight, c.InstancePerSecond(1)
	cfg.Mode = ModePull
	cfg.PubSub.Transport, cfg.PubSub.NATSURL = instance.TransportNATS, url
	start := time.Now()
	fn, err := Build(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		_ = fn.Close(cctx)
	})
	var msgs []event.Message
	for i := range n {
		e := &event.Event{Type: "order.purchased", Source: "order-service", Topic: flowTopic, AggregateID: fmt.Sprintf("o-%d", i),
			Version: 1, Payload: []byte(`{"amount":1}`)}
		if err := e.Prepare(time.Now(), event.Limits{}); err != nil {
			t.Fatal(err)
		}
		m, err := cloudevent.Encode(e, event.EncodingJSON)
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, m)
	}
	if got, err := nc.PublishBatch(ctx, flowTopic, msgs); err != nil || got != n {
		t.Fatalf("PublishBatch = %d, %v", got, err)
	}
	return nc, start
}

// A pull consumer with max_per_second on NATS JetStream: everything
// published at once is handled, no faster than the rate (counted, not
// timed: by any moment, at most 1 + rate × the time since the start).
func TestPullConsumerHeldToItsRate(t *testing.T) {
	const perSecond, n = 20.0, 30
	var mu sync.Mutex
	var times []time.Time
	_, start := pullFlowStack(t, fmt.Sprintf("max_per_second: %v", perSecond), n, func(context.Context, *consumer.Context) error {
		mu.Lock()
		times = append(times, time.Now())
		mu.Unlock()
		return nil
	})
	eventually.True(t, 60*time.Second, "every event handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(times) >= n
	})
	mu.Lock()
	defer mu.Unlock()
	sort.Slice(times, func(i, j int) bool { return times[i].Before(times[j]) })
	for k, at := range times {
		if allowed := 1 + perSecond*at.Sub(start).Seconds() + 1e-6; float64(k+1) > allowed {
			t.Fatalf("%d deliveries handled %s after the start; held to %v/s, at most %.2f may be", k+1, at.Sub(start), perSecond, allowed)
		}
	}
}

// A pull consumer with max_in_flight on NATS JetStream: its durable
// consumer's MaxAckPending is the limit, and however many messages wait,
// no more than max_in_flight deliveries run at once (the handler blocks
// until the test lets each go).
func TestPullConsumerInFlightCapHonoured(t *testing.T) {
	const limit, n = 2, 8
	var cur, peak, done atomic.Int64
	hold := make(chan struct{})
	nc, _ := pullFlowStack(t, fmt.Sprintf("max_in_flight: %d", limit), n, func(ctx context.Context, _ *consumer.Context) error {
		c := cur.Add(1)
		for p := peak.Load(); c > p && !peak.CompareAndSwap(p, c); p = peak.Load() {
		}
		defer cur.Add(-1)
		select {
		case <-hold:
		case <-ctx.Done():
			return ctx.Err()
		}
		done.Add(1)
		return nil
	})
	ctx := context.Background()
	cons, err := nc.JetStream().Consumer(ctx, nats.StreamName(flowTopic), nats.ConsumerName(flowSub))
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.MaxAckPending != limit {
		t.Errorf("MaxAckPending %d, want max_in_flight %d", info.Config.MaxAckPending, limit)
	}
	eventually.True(t, 30*time.Second, "two deliveries running", func() bool { return cur.Load() == limit })
	for range n {
		hold <- struct{}{}
	}
	eventually.True(t, 30*time.Second, "every delivery done", func() bool { return done.Load() == n })
	if p := peak.Load(); p != limit {
		t.Errorf("peak deliveries at once %d, want max_in_flight %d", p, limit)
	}
}
