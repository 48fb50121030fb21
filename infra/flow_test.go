package infra

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/zclconf/go-cty/cty"

	"github.com/relaybus/relaybus/shared/topology"
)

// flowTopology declares flow control on a push, an Eventarc and a pull
// consumer, and none on another push consumer.
const flowTopology = `
rollup: {topic: relaybus.ledger.rollup}
topics:
  - name: shop.order.events
    consumers:
      - service: limited
        max_in_flight: 5
        max_per_second: 30
        max_instances: 3
      - service: unset
      - service: eventarc
        delivery: eventarc
        max_per_second: 20
      - service: pulled
        max_per_second: 6
        max_in_flight: 2
`

// TestFlowControlOnCloudRun evaluates each consumer's flow control as
// Terraform applies it: a consume service's container concurrency is its
// max_in_flight (else consume_settings.concurrency, 40), its max
// instances its max_instances (else consume_settings.max_instances, 10,
// or pull_mode.max_instances for a pull consumer); CONSUMER_MAX_IN_FLIGHT
// is max_in_flight (0 unset) and CONSUMER_MAX_PER_SECOND each instance's
// share of max_per_second, as topology.Consumer.InstancePerSecond
// computes it; a consumer that declares nothing keeps today's settings.
func TestFlowControlOnCloudRun(t *testing.T) {
	c := loadTerraform(t, terraformDir(t))
	path := filepath.Join(t.TempDir(), "topology.yaml")
	if err := os.WriteFile(path, []byte(flowTopology), 0o644); err != nil {
		t.Fatal(err)
	}
	top, err := topology.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	const pulled = "shop.order.events.pulled-processor"
	vars := requiredVars(t)
	vars["topology_file"] = cty.StringVal(path)
	vars["pull_mode"] = cty.ObjectVal(map[string]cty.Value{
		"enabled": cty.True, "consumers": cty.ListVal([]cty.Value{cty.StringVal(pulled)}), "min_instances": cty.NumberIntVal(1),
		"max_instances": cty.NumberIntVal(1), "max_in_flight": cty.NumberIntVal(4), "exactly_once_delivery": cty.False,
	})
	ev := c.newEvaluator(t, vars).withStubs()
	env := jsonValue(t, ev.local("consume_env")).(map[string]any)
	run := c.resource(t, "google_cloud_run_v2_service.consume")
	runs := forEachKeys(t, ev, run)
	for _, tc := range []struct {
		sub                  string
		concurrency, maxInst int64
		inFlight, perSecond  string
	}{
		{"shop.order.events.limited-processor", 5, 3, "5", "10"},
		{"shop.order.events.unset-processor", 40, 10, "0", "0"},
		{"shop.order.events.eventarc-processor", 40, 10, "0", "2"},
		{pulled, 2, 1, "2", "6"},
	} {
		cs, ok := top.Consumer(tc.sub)
		if !ok {
			t.Fatalf("%s not in the topology", tc.sub)
		}
		defaultInstances := 10
		if tc.sub == pulled {
			defaultInstances = 1
		}
		if got := strconv.FormatFloat(cs.InstancePerSecond(defaultInstances), 'f', -1, 64); got != tc.perSecond {
			t.Fatalf("%s: topology.Consumer.InstancePerSecond = %s, the case says %s", tc.sub, got, tc.perSecond)
		}
		e := env[tc.sub].(map[string]any)
		if e["CONSUMER_MAX_IN_FLIGHT"] != tc.inFlight || e["CONSUMER_MAX_PER_SECOND"] != tc.perSecond {
			t.Errorf("consume %s: CONSUMER_MAX_IN_FLIGHT=%v CONSUMER_MAX_PER_SECOND=%v, want %s and %s",
				tc.sub, e["CONSUMER_MAX_IN_FLIGHT"], e["CONSUMER_MAX_PER_SECOND"], tc.inFlight, tc.perSecond)
		}
		in := newInstance(t, ev, ev.stubs, "google_cloud_run_v2_service.consume", tc.sub, runs[tc.sub])
		tmpl := block(t, tc.sub, run.Body, "template")
		if got := in.attr(tmpl, "max_instance_request_concurrency"); !got.RawEquals(cty.NumberIntVal(tc.concurrency)) {
			t.Errorf("consume %s: container concurrency %#v, want %d", tc.sub, got, tc.concurrency)
		}
		if got := in.attr(block(t, tc.sub, tmpl, "scaling"), "max_instance_count"); !got.RawEquals(cty.NumberIntVal(tc.maxInst)) {
			t.Errorf("consume %s: max instances %#v, want %d", tc.sub, got, tc.maxInst)
		}
	}
	// The Cloud SQL connection arithmetic counts each consumer's own max
	// instances: pool_max_conns 5 × (publish 20 + relay 3 + dlqreplay 2 +
	// consume 3 + 10 + 10 + 1).
	conns := jsonValue(t, ev.local("database_connections")).(map[string]any)
	if got := conns["main"]; got != json.Number("245") {
		t.Errorf("main's connections %v, want 245", got)
	}
}
