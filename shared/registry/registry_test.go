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
	now = now.Add(time.Minute)
	_, _ = r.ExpectedConsumers(ctx, "a.b.c")
	if next.calls != 2 {
		t.Fatalf("answer not refreshed after the TTL: %d lookups", next.calls)
	}
	next.err = errors.New("down")
	if _, err := r.ExpectedConsumers(ctx, "x.y.z"); err == nil {
		t.Fatal("error swallowed")
	}
	next.err = nil
	if _, err := r.ExpectedConsumers(ctx, "x.y.z"); err != nil {
		t.Fatal("error was cached")
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
