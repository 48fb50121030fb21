package topology

import (
	"strings"
	"testing"
)

func TestFlowControlDefaultsKeepTodaysBehaviour(t *testing.T) {
	top, err := Parse([]byte(`
rollup: {topic: relaybus.ledger.rollup}
topics:
  - name: shop.order.events
    consumers:
      - service: member-service
`))
	if err != nil {
		t.Fatal(err)
	}
	c := top.Consumers()[0]
	if c.MaxInFlight != 0 || c.MaxPerSecond != 0 || c.MaxInstances != 0 {
		t.Errorf("a consumer that declares nothing is unset (Terraform's and the stack's defaults): %+v", c)
	}
	if got := c.InstancePerSecond(10); got != 0 {
		t.Errorf("no rate limit: InstancePerSecond %v, want 0", got)
	}
}

func TestFlowControlPerConsumerOverDefaults(t *testing.T) {
	top, err := Parse([]byte(`
defaults: {max_in_flight: 8, max_per_second: 50, max_instances: 5}
rollup: {topic: relaybus.ledger.rollup}
topics:
  - name: shop.order.events
    consumers:
      - service: inherits
      - service: own
        max_in_flight: 2
        max_per_second: 0.5
        max_instances: 1
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		service     string
		inFlight    int
		perSecond   float64
		instances   int
		perInstance float64
	}{
		{"inherits", 8, 50, 5, 10},
		{"own", 2, 0.5, 1, 0.5},
	} {
		var c Consumer
		for _, x := range top.Consumers() {
			if x.Service == tc.service {
				c = x
			}
		}
		if c.MaxInFlight != tc.inFlight || c.MaxPerSecond != tc.perSecond || c.MaxInstances != tc.instances {
			t.Errorf("%s: in flight %d, per second %v, instances %d; want %d, %v, %d", tc.service,
				c.MaxInFlight, c.MaxPerSecond, c.MaxInstances, tc.inFlight, tc.perSecond, tc.instances)
		}
		if got := c.InstancePerSecond(10); got != tc.perInstance {
			t.Errorf("%s: InstancePerSecond(10) %v, want %v", tc.service, got, tc.perInstance)
		}
	}
	// Without max_instances, the share divides by the deployment's default.
	if got := (Consumer{MaxPerSecond: 30}).InstancePerSecond(10); got != 3 {
		t.Errorf("InstancePerSecond(10) of 30/s with no max_instances: %v, want 3", got)
	}
}

func TestFlowControlRefusedWithTheRule(t *testing.T) {
	base := `
rollup: {topic: relaybus.ledger.rollup}
topics:
  - name: shop.order.events
    consumers:
      - service: member-service
`
	for _, tc := range []struct{ field, want string }{
		{"max_in_flight: -1", "max_in_flight: must be 1 to 1000"},
		{"max_in_flight: 1001", "max_in_flight: must be 1 to 1000"},
		{"max_instances: -2", "max_instances: must be 1 to 1000"},
		{"max_per_second: -0.5", "max_per_second: must be above 0"},
		{"max_per_second: 1e9", "max_per_second: must be above 0"},
		{"max_per_second: .nan", "max_per_second: must be above 0"},
		{"max_per_second: lots", "cannot unmarshal"},
	} {
		_, err := Parse([]byte(base + "        " + tc.field + "\n"))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want it to say %q", tc.field, err, tc.want)
		}
		if err != nil && tc.want != "cannot unmarshal" && !strings.Contains(err.Error(), "consumers[0] (member-service)") {
			t.Errorf("%s: error %v does not name the consumer", tc.field, err)
		}
	}
}
