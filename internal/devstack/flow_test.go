package devstack

import (
	"testing"

	"github.com/relaybus/relaybus/functions/consume"
	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/shared/topology"
)

// The local stack applies a consumer's flow control as Terraform does in
// production: its route's in-flight bound (the loop's 64 when unset) and
// its consume's CONSUMER_MAX_IN_FLIGHT and CONSUMER_MAX_PER_SECOND (the
// whole rate: one process per consumer); in pull mode (NATS) the worker's
// bound is the lower of max_in_flight and its pool.
func TestStackAppliesFlowControl(t *testing.T) {
	top, err := topology.Parse([]byte(`
rollup: {topic: relaybus.ledger.rollup}
topics:
  - name: shop.order.events
    consumers:
      - service: limited
        max_in_flight: 3
        max_per_second: 12
        max_instances: 4
      - service: unset
`))
	if err != nil {
		t.Fatal(err)
	}
	var mounted []mountedConsumer
	for _, c := range top.Consumers() {
		mounted = append(mounted, mountedConsumer{Consumer: c, URL: "http://stack/consume/" + c.Subscription()})
	}
	d := &standIn{loop: &Loop{}}
	d.route("http://stack", top, mounted, 1)
	want := map[string]int{"shop.order.events.limited-processor": 3, "shop.order.events.unset-processor": 0}
	for _, r := range d.routes {
		if w, ok := want[r.Subscription]; ok {
			if r.MaxInFlight != w {
				t.Errorf("route %s: MaxInFlight %d, want %d", r.Subscription, r.MaxInFlight, w)
			}
			delete(want, r.Subscription)
		}
	}
	if len(want) > 0 {
		t.Errorf("no route for %v", want)
	}

	in := functionsInput{Functions: Functions{Consume: instance.Defaults[consume.Config]()}, Topology: top, Pushes: true,
		DBs: databases{URLs: map[string]string{"main": "postgres://localhost/db"}, shares: map[poolRole]int{roleConsumer: 2}}}
	for _, tc := range []struct {
		c         topology.Consumer
		inFlight  int
		perSecond float64
	}{
		{top.Consumers()[0], 3, 12},
		{top.Consumers()[1], 0, 0},
	} {
		cc := consumerConfig(in, tc.c)
		if cc.MaxInFlight != tc.inFlight || cc.MaxPerSecond != tc.perSecond {
			t.Errorf("%s: CONSUMER_MAX_IN_FLIGHT %d, CONSUMER_MAX_PER_SECOND %v; want %d, %v",
				tc.c.Service, cc.MaxInFlight, cc.MaxPerSecond, tc.inFlight, tc.perSecond)
		}
	}
}
