package registry

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/relaybus/relaybus/shared/topology"
)

type counting struct {
	calls int
	err   error
}

func (c *counting) ExpectedConsumers(_ context.Context, topic string) ([]Consumer, error) {
	c.calls++
	if c.err != nil {
		return nil, c.err
	}
	return []Consumer{{Topic: topic, ConsumerID: "c", Enabled: true}}, nil
}

func TestCachedKeepsAnswersForTTLButNotErrors(t *testing.T) {
	next := &counting{}
	r := Cached(next, time.Minute).(*cached)
	now := time.Unix(1000, 0)
	r.now = func() time.Time { return now }
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		if got, err := r.ExpectedConsumers(ctx, "a.b.c"); err != nil || len(got) != 1 {
			t.Fatal(got, err)
		}
	}
	if next.calls != 1 {
		t.Fatalf("%d lookups within the TTL, want 1", next.calls)
	}
	// Past the TTL: the old answer at once, one refresh in the background.
	now = now.Add(time.Minute)
	next.err = errors.New("down")
	for i := 0; i < 3; i++ {
		if got, err := r.ExpectedConsumers(ctx, "a.b.c"); err != nil || len(got) != 1 {
			t.Fatalf("stale answer: %v %v", got, err)
		}
	}
	r.wg.Wait()
	if next.calls != 2 {
		t.Fatalf("%d lookups after the TTL, want one refresh", next.calls)
	}
	// The failed refresh keeps the old answer; the next call refreshes again.
	next.err = nil
	if _, err := r.ExpectedConsumers(ctx, "a.b.c"); err != nil {
		t.Fatal(err)
	}
	r.wg.Wait()
	if next.calls != 3 {
		t.Fatalf("%d lookups, want the refresh tried again", next.calls)
	}
	// A topic never seen waits for its lookup; its error is not kept.
	next.err = errors.New("down")
	if _, err := r.ExpectedConsumers(ctx, "x.y.z"); err == nil {
		t.Fatal("error swallowed")
	}
	next.err = nil
	if _, err := r.ExpectedConsumers(ctx, "x.y.z"); err != nil {
		t.Fatal("error was cached")
	}
}

// slow answers after a delay, or when its context ends.
type slow struct{ delay time.Duration }

func (s slow) ExpectedConsumers(ctx context.Context, topic string) ([]Consumer, error) {
	select {
	case <-time.After(s.delay):
		return []Consumer{{Topic: topic, ConsumerID: "from-firestore"}}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func TestWithFallbackAnswersFromTheFallbackWhenTheRegistryIsSlowOrDown(t *testing.T) {
	top, err := topology.Parse([]byte("rollup: {topic: relaybus.ledger.rollup}\ntopics: [{name: shop.order.events, consumers: [{service: from-topology}]}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	got, err := WithFallback(slow{time.Millisecond}, FromTopology(top), time.Second).ExpectedConsumers(ctx, "shop.order.events")
	if err != nil || got[0].ConsumerID != "from-firestore" {
		t.Fatalf("registry up: %+v %v", got, err)
	}
	start := time.Now()
	got, err = WithFallback(slow{time.Minute}, FromTopology(top), 50*time.Millisecond).ExpectedConsumers(ctx, "shop.order.events")
	if err != nil || got[0].ConsumerID != "from-topology" || time.Since(start) > 5*time.Second {
		t.Fatalf("registry slow: %+v %v after %v", got, err, time.Since(start))
	}
	got, err = WithFallback(&counting{err: errors.New("down")}, FromTopology(top), time.Second).ExpectedConsumers(ctx, "shop.order.events")
	if err != nil || got[0].ConsumerID != "from-topology" {
		t.Fatalf("registry down: %+v %v", got, err)
	}
}

func TestFromTopology(t *testing.T) {
	top, err := topology.Parse([]byte(`
rollup: {topic: relaybus.ledger.rollup}
topics:
  - name: shop.order.events
    consumers:
      - {service: b, sort_order: 2}
      - {service: a, sort_order: 1, description: first}
      - {service: off, enabled: false}
  - name: shop.cart.events
`))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := FromTopology(top).ExpectedConsumers(context.Background(), "shop.order.events")
	if len(got) != 2 || got[0].ConsumerID != "a" || got[0].Description != "first" || got[1].ConsumerID != "b" {
		t.Errorf("got %+v", got)
	}
	if got, _ := FromTopology(top).ExpectedConsumers(context.Background(), "shop.cart.events"); len(got) != 0 {
		t.Errorf("topic without consumers: %+v", got)
	}
	all := Consumers(top)
	if len(all) != 3 || all[2].ConsumerID != "off" || all[2].Enabled {
		t.Errorf("seed entries %+v", all)
	}
}
