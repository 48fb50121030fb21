package infra

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"

	"github.com/zclconf/go-cty/cty"

	"github.com/relaybus/relaybus/internal/names"
	"github.com/relaybus/relaybus/shared/broker"
	"github.com/relaybus/relaybus/shared/topology"
)

// topologyCases are topologies beyond the repository's own: defaults
// overridden, zero values meaning "unset", a topic without consumers, extra
// filters, disabled and forward consumers (each authentication mode),
// strict gap timeouts, Eventarc delivery.
var topologyCases = map[string]string{
	"minimal": `
rollup: {topic: relaybus.ledger.rollup}
topics:
  - name: shop.order.events
    consumers:
      - service: billing
`,
	"overrides": `
defaults:
  ack_deadline_seconds: 120
  message_retention_seconds: 86400
  min_backoff_seconds: 5
  max_backoff_seconds: 300
  max_delivery_attempts: 10
  delivery: eventarc
  role: reader
  handler: strict
  encoding: protobuf
  max_in_flight: 8
  max_per_second: 25
  max_instances: 4
rollup: {topic: ops.ledger.rollup, delivery: eventarc}
databases:
  - name: main
  - name: billing-db
    description: billing's own database.
relay: {schedule: "*/2 * * * *", time_budget_seconds: 90, attempt_deadline_seconds: 300}
topics:
  - name: shop.order.events
    encoding: json
    message_retention_seconds: 0
    publishers: [serviceAccount:billing-api@p.iam.gserviceaccount.com, ops@example.com, checkout@p.iam.gserviceaccount.com]
    consumers:
      - service: billing
        role: ""
        database: billing-db
        delivery: push
        ack_deadline_seconds: 0
        min_backoff_seconds: 30
        max_backoff_seconds: 600
        max_delivery_attempts: 20
        max_in_flight: 1
        max_per_second: 0.5
        max_instances: 1
        filter: 'attributes.event_type = "order.paid"'
      - service: archive
        handler: forward
        forward_url: https://archive.example.com/events
        forward_auth: google
        forward_audience: https://archive.example.com
        enabled: false
        sort_order: 3
      - service: partner
        handler: forward
        delivery: push
        forward_probe: GET /healthz
        forward_url: https://partner.example.com/hooks
        forward_auth: hmac
        forward_secret: partner-signing-secret
        forward_timeout_seconds: 30
        forward_breaker_threshold: 3
        forward_breaker_cooldown_seconds: 10
        forward_breaker_max_cooldown_seconds: 600
      - service: ledger
        gap_timeout_seconds: 1800
        emits: [shop.refund.events, shop.cart.events]
  - name: shop.cart.events
    message_retention_seconds: 3600
    consumers:
  - name: shop.refund.events
`,
}

// topologyFile writes a case to a temporary file and returns its path and
// what topology.Load makes of it.
func topologyFile(t *testing.T, doc string) (string, *topology.Topology) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "topology.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	top, err := topology.Load(path)
	if err != nil {
		t.Fatalf("the case is not a valid topology: %v", err)
	}
	return path, top
}

func repoTopology(t *testing.T) (string, *topology.Topology) {
	t.Helper()
	path := filepath.Join(repoRoot(t), "infra", "topology.yaml")
	top, err := topology.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return path, top
}

// TestTerraformReadsTheTopologyAsLoadDoes evaluates topology.tf's locals
// (Terraform's yamldecode and functions) and compares them with
// topology.Load, for the repository's topology and the edge cases.
func TestTerraformReadsTheTopologyAsLoadDoes(t *testing.T) {
	c := loadTerraform(t, filepath.Join(repoRoot(t), "infra", "terraform"))
	cases := map[string]string{"infra/topology.yaml": ""}
	for k, v := range topologyCases {
		cases[k] = v
	}
	for name, doc := range cases {
		t.Run(name, func(t *testing.T) {
			var path string
			var top *topology.Topology
			if doc == "" {
				path, top = repoTopology(t)
			} else {
				path, top = topologyFile(t, doc)
			}
			ev := c.newEvaluator(t, map[string]cty.Value{"topology_file": cty.StringVal(path)})
			assertTopologyAgrees(t, ev, top)
		})
	}
}

// assertTopologyAgrees compares the Terraform locals with a loaded topology.
func assertTopologyAgrees(t *testing.T, ev *evaluator, top *topology.Topology) {
	t.Helper()
	topics := jsonValue(t, ev.local("topics")).(map[string]any)
	if len(topics) != len(top.Topics) {
		t.Errorf("terraform has %d topics, topology.Load %d", len(topics), len(top.Topics))
	}
	for _, tp := range top.Topics {
		got, ok := topics[tp.Name].(map[string]any)
		if !ok {
			t.Errorf("topic %s: missing in terraform", tp.Name)
			continue
		}
		want := map[string]any{
			"name": tp.Name, "description": tp.Description, "encoding": tp.Encoding,
			"message_retention_seconds": json.Number(itoa(tp.MessageRetentionSeconds)),
			"dead_letter_topic":         names.DeadLetter(tp.Name), "dead_letter_monitor": names.DeadLetterMonitor(tp.Name),
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("topic %s:\nterraform %v\nLoad      %v", tp.Name, got, want)
		}
	}

	consumers := jsonValue(t, ev.local("consumers")).(map[string]any)
	all := top.Consumers()
	if len(consumers) != len(all) {
		t.Errorf("terraform has %d consumers, topology.Load %d", len(consumers), len(all))
	}
	push := jsonValue(t, ev.local("push_consumers")).(map[string]any)
	eventarc := jsonValue(t, ev.local("eventarc_consumers")).(map[string]any)
	for _, cs := range all {
		sub := cs.Subscription()
		got, ok := consumers[sub].(map[string]any)
		if !ok {
			t.Errorf("consumer %s: missing in terraform (has %v)", sub, keysOf(consumers))
			continue
		}
		want := map[string]any{
			"topic": cs.Topic, "service": cs.Service, "role": cs.Role, "description": cs.Description,
			"delivery": cs.Delivery, "handler": cs.Handler, "forward_url": cs.ForwardURL,
			"forward_auth": cs.ForwardAuth, "forward_audience": cs.ForwardAudience, "forward_secret": cs.ForwardSecret,
			"forward_timeout_seconds":              json.Number(itoa(cs.ForwardTimeoutSeconds)),
			"forward_breaker_threshold":            json.Number(itoa(cs.ForwardBreakerThreshold)),
			"forward_breaker_cooldown_seconds":     json.Number(itoa(cs.ForwardBreakerCoolDownSeconds)),
			"forward_breaker_max_cooldown_seconds": json.Number(itoa(cs.ForwardBreakerMaxCoolDownSeconds)),
			"gap_timeout_seconds":                  json.Number(itoa(cs.GapTimeoutSeconds)),
			"extra_filter":                         cs.ExtraFilter, "enabled": cs.IsEnabled(),
			"ack_deadline_seconds":      json.Number(itoa(cs.AckDeadlineSeconds)),
			"min_backoff_seconds":       json.Number(itoa(cs.MinBackoffSeconds)),
			"max_backoff_seconds":       json.Number(itoa(cs.MaxBackoffSeconds)),
			"max_delivery_attempts":     json.Number(itoa(cs.MaxDeliveryAttempts)),
			"message_retention_seconds": json.Number(itoa(top.Topic(cs.Topic).MessageRetentionSeconds)),
			"subscription":              sub,
			"dead_letter_topic":         cs.DeadLetterTopic(),
			"replay_filter":             cs.ReplayFilter(),
			"filter":                    cs.Filter(),
			"database":                  cs.Database,
			"max_in_flight":             json.Number(itoa(cs.MaxInFlight)),
			"max_per_second":            json.Number(strconv.FormatFloat(cs.MaxPerSecond, 'f', -1, 64)),
			"max_instances":             json.Number(itoa(cs.MaxInstances)),
		}
		for k, w := range want {
			if !reflect.DeepEqual(got[k], w) {
				t.Errorf("consumer %s: %s: terraform %#v, topology.Load %#v", sub, k, got[k], w)
			}
		}
		_, inPush := push[sub]
		_, inEventarc := eventarc[sub]
		if inPush != (cs.Delivery == topology.DeliveryPush) || inEventarc != (cs.Delivery == topology.DeliveryEventarc) {
			t.Errorf("consumer %s (delivery %s): in push_consumers %v, in eventarc_consumers %v", sub, cs.Delivery, inPush, inEventarc)
		}
		run, _ := got["run_service"].(string)
		if !cloudRunName.MatchString(run) || len(run) > 49 {
			t.Errorf("consumer %s: Cloud Run service name %q: want [a-z][-a-z0-9]*[a-z0-9], at most 49 characters", sub, run)
		}
		acct, _ := got["account_id"].(string)
		if !accountID.MatchString(acct) {
			t.Errorf("consumer %s: service account id %q: want 6 to 30 characters of [a-z0-9-] starting with a letter", sub, acct)
		}
	}
	assertUnique(t, consumers, "run_service")
	assertUnique(t, consumers, "account_id")

	databases := jsonValue(t, ev.local("databases")).(map[string]any)
	if len(databases) != len(top.Databases) {
		t.Errorf("terraform has %d databases, topology.Load %d", len(databases), len(top.Databases))
	}
	for _, d := range top.Databases {
		want := map[string]any{"name": d.Name, "description": d.Description, "env_var": d.EnvVar()}
		if got := databases[d.Name]; !reflect.DeepEqual(got, want) {
			t.Errorf("database %s: terraform %v, topology.Load %v", d.Name, got, want)
		}
	}

	rollup := jsonValue(t, ev.local("rollup")).(map[string]any)
	wantRollup := map[string]any{"topic": top.Rollup.Topic, "delivery": top.Rollup.Delivery, "subscription": broker.RollupSubscription(top)}
	if !reflect.DeepEqual(rollup, wantRollup) {
		t.Errorf("rollup: terraform %v, topology.Load %v", rollup, wantRollup)
	}
	relay := jsonValue(t, ev.local("relay")).(map[string]any)
	wantRelay := map[string]any{
		"schedule":                 top.Relay.Schedule,
		"time_budget_seconds":      json.Number(itoa(top.Relay.TimeBudgetSeconds)),
		"attempt_deadline_seconds": json.Number(itoa(top.Relay.AttemptDeadlineSeconds)),
	}
	if !reflect.DeepEqual(relay, wantRelay) {
		t.Errorf("relay: terraform %v, topology.Load %v", relay, wantRelay)
	}
}
