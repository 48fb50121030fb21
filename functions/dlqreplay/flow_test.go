package dlqreplay_test

import (
	"testing"

	"github.com/relaybus/relaybus/functions/dlqreplay"
)

// GET /consumers shows each declared consumer's flow control as the
// topology sets it (0: unset) and names the metric that says whether an
// instance is at its limits.
func TestConsumersShowTheirFlowControl(t *testing.T) {
	e := newEnvWith(t, func(o *dlqreplay.Options) {
		o.Auth = dlqreplay.AuthNone
		for i := range o.Topology.Topics {
			for j := range o.Topology.Topics[i].Consumers {
				if c := &o.Topology.Topics[i].Consumers[j]; c.Service == "member-service" {
					c.MaxInFlight, c.MaxPerSecond, c.MaxInstances = 4, 2.5, 3
				}
			}
		}
	})
	var out struct {
		Consumers []struct {
			Topic      string         `json:"topic"`
			ConsumerID string         `json:"consumerId"`
			Flow       map[string]any `json:"flow"`
		} `json:"consumers"`
	}
	if code := e.call(t, "GET", "/consumers?topic=shop.order.events", nil, &out); code != 200 {
		t.Fatalf("GET /consumers: %d", code)
	}
	seen := map[string]bool{}
	for _, c := range out.Consumers {
		seen[c.ConsumerID] = true
		want := map[string]any{"maxInFlight": 0.0, "maxPerSecond": 0.0, "maxInstances": 0.0, "atLimitMetric": "relaybus.consume.flow.at_limit"}
		if c.ConsumerID == "member-service" {
			want["maxInFlight"], want["maxPerSecond"], want["maxInstances"] = 4.0, 2.5, 3.0
		}
		for k, w := range want {
			if c.Flow[k] != w {
				t.Errorf("%s: flow.%s = %v, want %v", c.ConsumerID, k, c.Flow[k], w)
			}
		}
	}
	if !seen["member-service"] || !seen["message-service"] {
		t.Errorf("consumers listed: %v", seen)
	}
}
