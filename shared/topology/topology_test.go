package topology

import (
	"strings"
	"testing"
)

func TestLoadTheRepositoryTopology(t *testing.T) {
	top, err := Load("")
	if err != nil {
		t.Fatal(err)
	}
	if top.Rollup.Topic != "relaybus.ledger.rollup" {
		t.Errorf("rollup topic %q", top.Rollup.Topic)
	}
	c, ok := top.Consumer("projects/p/subscriptions/shop.order.events.member-service-processor")
	if !ok {
		t.Fatal("member-service subscription not found")
	}
	if c.AckDeadlineSeconds != 60 || c.MinBackoffSeconds != 10 || c.MaxBackoffSeconds != 600 || c.MaxDeliveryAttempts != 5 || c.Delivery != DeliveryPush {
		t.Errorf("defaults not applied: %+v", c)
	}
	if c.DeadLetterTopic() != "shop.order.events.dlq" {
		t.Errorf("dlq %q", c.DeadLetterTopic())
	}
	exp := top.EnabledConsumers("shop.order.events")
	if len(exp) != 2 || exp[0].Service != "member-service" || exp[1].Service != "message-service" {
		t.Errorf("expected consumers %+v", exp)
	}
	if top.Topic("message.notification.events").Encoding != "protobuf" || top.Topic("shop.order.events").Encoding != "json" {
		t.Error("encodings")
	}
}

func TestFilter(t *testing.T) {
	c := Consumer{Service: "member-service"}
	if got := c.Filter(); got != `NOT attributes:target_consumer OR attributes.target_consumer = "member-service"` {
		t.Errorf("filter %s", got)
	}
	c.ExtraFilter = `attributes.event_type = "order.purchased"`
	if got := c.Filter(); got != `(attributes.event_type = "order.purchased") AND (NOT attributes:target_consumer OR attributes.target_consumer = "member-service")` {
		t.Errorf("filter %s", got)
	}
}

func TestParseRefusesWithTheRule(t *testing.T) {
	base := `
rollup: {topic: relaybus.ledger.rollup}
topics:
  - name: shop.order.events
    consumers:
      - service: member-service
`
	if _, err := Parse([]byte(base)); err != nil {
		t.Fatalf("minimal topology refused: %v", err)
	}
	for _, tc := range []struct{ doc, want string }{
		{strings.Replace(base, "shop.order.events", "Shop_Orders", 1), "<domain>.<aggregate>.<category>"},
		{strings.Replace(base, "member-service", "Member", 1), "consumer service is"},
		{base + "        delivery: pull\n", "must be push or eventarc"},
		{base + "        max_delivery_attempts: 3\n", "must be 5 to 100"},
		{base + "        ack_deadline_seconds: 601\n", "must be 10 to 600"},
		{base + "        min_backoff_seconds: 30\n        max_backoff_seconds: 20\n", "max_backoff_seconds"},
		{base + "        handler: forward\n", "forward handler needs an http(s) URL"},
		{base + "        retries: 3\n", "field retries not found"},
		{base + "      - service: member-service\n", "declared twice"},
		{strings.Replace(base, "relaybus.ledger.rollup", "shop.order.events", 1), "rollup topic"},
		{base + "    encoding: avro\n", "unknown payload encoding"},
		{base + "relay: {time_budget_seconds: 200, attempt_deadline_seconds: 120}\n", "below attempt_deadline_seconds"},
		{strings.Replace(base, "shop.order.events", "shop.order.events.dlq", 1), "derived"},
		{base + "        database: member\n", `must name one of the topology's databases, not "member"`},
		{"databases: [{name: shop}]\n" + base, `must declare "main"`},
		{"databases: [{name: main}, {name: Member_DB}]\n" + base, "must be a lowercase letter"},
		{"databases: [{name: main}, {name: main}]\n" + base, "database declared twice"},
		{"databases: [{name: main, outbox_tables: [Orders]}]\n" + base, `databases[0] (main).outbox_tables[0]: must be a lower-case SQL identifier`},
		{"databases: [{name: main, outbox_tables: [relaybus_outbox]}]\n" + base, `not starting with relaybus_, not "relaybus_outbox"`},
		{"databases: [{name: main, outbox_tables: [orders_outbox, orders_outbox]}]\n" + base, "outbox_tables[1]: orders_outbox listed twice"},
		{base + "        forward_auth: google\n", `only the forward handler uses forward_auth (handler is "projection")`},
		{base + "        handler: forward\n        forward_url: http://x.example/in\n        forward_auth: google\n", "must be https with forward_auth google"},
		{base + "        handler: forward\n        forward_url: http://x.example/in\n        forward_auth: hmac\n        forward_secret: s\n", "must be https with forward_auth hmac"},
		{base + "        handler: forward\n        forward_url: https://svc:pw@x.example/in\n", "must not carry a user or password"},
		{base + "        handler: forward\n        forward_url: https://x.example\n        forward_auth: jwt\n", "must be none, google or hmac"},
		{base + "        handler: forward\n        forward_url: https://x.example\n        forward_auth: hmac\n", "forward_auth hmac needs the Secret Manager secret id"},
		{base + "        handler: forward\n        forward_url: https://x.example\n        forward_auth: hmac\n        forward_secret: a/b\n", "forward_auth hmac needs the Secret Manager secret id"},
		{base + "        handler: forward\n        forward_url: https://x.example\n        forward_secret: s\n", "only forward_auth hmac uses forward_secret"},
		{base + "        handler: forward\n        forward_url: https://x.example\n        forward_audience: https://x.example\n", "only forward_auth google uses forward_audience"},
		{base + "        handler: forward\n        forward_url: https://x.example\n        forward_timeout_seconds: 60\n", "below ack_deadline_seconds (60)"},
		{base + "        handler: strict\n        gap_timeout_seconds: 30\n", "must be 60 to 604800"},
		{base + "        handler: example.points\n        rebuild_clear: [\"points; DROP TABLE x\"]\n", "rebuild_clear[0]: must be a table name"},
		{base + "        handler: example.points\n        rebuild_clear: [relaybus_inbox]\n", "not relaybus's own"},
		{base + "        handler: forward\n        forward_url: https://x.example\n        forward_breaker_threshold: -2\n", "forward_breaker_threshold: must be 1 to 1000, or -1"},
		{base + "        handler: forward\n        forward_url: https://x.example\n        forward_breaker_cooldown_seconds: 7200\n", "forward_breaker_cooldown_seconds: must be 1 to 3600"},
		{base + "        handler: forward\n        forward_url: https://x.example\n        forward_breaker_cooldown_seconds: 60\n        forward_breaker_max_cooldown_seconds: 30\n", "must be forward_breaker_cooldown_seconds (60) to 3600, not 30"},
		{base + "        handler: forward\n        forward_url: https://x.example\n        forward_probe: DELETE /health\n", `forward_probe: must be "METHOD /path", "METHOD" or "/path"`},
		{base + "        handler: forward\n        forward_url: https://x.example\n        forward_probe: health\n", `not "health"`},
	} {
		_, err := Parse([]byte(tc.doc))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want error containing %q, got %v\n%s", tc.want, err, tc.doc)
		}
	}
}

func TestEnabledConsumersOrderAndDisabled(t *testing.T) {
	top, err := Parse([]byte(`
rollup: {topic: relaybus.ledger.rollup}
topics:
  - name: shop.order.events
    consumers:
      - {service: zeta, sort_order: 1}
      - {service: alpha, sort_order: 2}
      - {service: beta, sort_order: 1}
      - {service: off, enabled: false}
`))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range top.EnabledConsumers("shop.order.events") {
		got = append(got, c.Service)
	}
	if strings.Join(got, ",") != "beta,zeta,alpha" {
		t.Errorf("got %v", got)
	}
	if top.EnabledConsumers("no.such.topic") != nil {
		t.Error("unknown topic has consumers")
	}
}

func TestDatabases(t *testing.T) {
	top, err := Parse([]byte(`
rollup: {topic: relaybus.ledger.rollup}
databases:
  - {name: main}
  - {name: member-db, description: member-service's own}
topics:
  - name: shop.order.events
    consumers:
      - {service: member-service, database: member-db}
      - {service: message-service}
`))
	if err != nil {
		t.Fatal(err)
	}
	cs := top.Consumers()
	if cs[0].Database != "member-db" || cs[1].Database != MainDatabase {
		t.Errorf("consumer databases %q, %q", cs[0].Database, cs[1].Database)
	}
	for name, want := range map[string]string{"main": "DATABASE_URL", "member-db": "DATABASE_URL_MEMBER_DB"} {
		d, ok := top.Database(name)
		if !ok || d.EnvVar() != want {
			t.Errorf("database %s: %v %q, want %q", name, ok, d.EnvVar(), want)
		}
	}
	// A file that declares no database has the main one.
	top, err = Parse([]byte("rollup: {topic: relaybus.ledger.rollup}\ntopics: [{name: shop.order.events, consumers: [{service: a}]}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(top.Databases) != 1 || top.Databases[0].Name != MainDatabase || top.Consumers()[0].Database != MainDatabase {
		t.Errorf("implicit databases %+v", top.Databases)
	}
}

// The forward and strict fields: defaults, and a valid declaration of each
// authentication mode.
func TestForwardAndStrictSettings(t *testing.T) {
	top, err := Parse([]byte(`
rollup: {topic: relaybus.ledger.rollup}
topics:
  - name: shop.order.events
    consumers:
      - service: audit-service
        handler: strict
      - service: archive-service
        handler: forward
        forward_url: https://archive.example.com/events
        forward_auth: google
      - service: partner-service
        handler: forward
        forward_url: https://partner.example.com/hooks
        forward_auth: hmac
        forward_secret: partner-signing-secret
        forward_timeout_seconds: 20
        gap_timeout_seconds: 900
`))
	if err != nil {
		t.Fatal(err)
	}
	cs := top.Consumers()
	if c := cs[0]; c.ForwardAuth != ForwardAuthNone || c.ForwardTimeoutSeconds != DefaultForwardTimeoutSeconds || c.GapTimeoutSeconds != DefaultGapTimeoutSeconds {
		t.Errorf("defaults: %+v", c)
	}
	if c := cs[1]; c.ForwardAuth != ForwardAuthGoogle || c.ForwardAudience != "" {
		t.Errorf("google: %+v", c)
	}
	if c := cs[2]; c.ForwardAuth != ForwardAuthHMAC || c.ForwardSecret != "partner-signing-secret" || c.ForwardTimeoutSeconds != 20 || c.GapTimeoutSeconds != 900 {
		t.Errorf("hmac: %+v", c)
	}
}

// An aggregate type belongs to one topic: its aggregate segment by
// default, or the aggregate_types it declares; two topics claiming one
// type are refused with the rule.
func TestAggregateTypesBelongToOneTopic(t *testing.T) {
	top, err := Parse([]byte(`
rollup: {topic: relaybus.ledger.rollup}
topics:
  - name: shop.order.events
    consumers: [{service: a}]
  - name: member.points.events
    aggregate_types: [member, member_tier]
    consumers: [{service: a}]
`))
	if err != nil {
		t.Fatal(err)
	}
	for typ, want := range map[string]string{"order": "shop.order.events", "member": "member.points.events", "member_tier": "member.points.events", "points": ""} {
		if got, ok := top.AggregateTopic(typ); got != want || ok != (want != "") {
			t.Errorf("AggregateTopic(%q) = %q, %v; want %q", typ, got, ok, want)
		}
	}
	for name, doc := range map[string]string{
		"two topics, one aggregate segment": `
  - name: shop.order.events
  - name: billing.order.events`,
		"a declared type another topic has by default": `
  - name: shop.order.events
  - name: billing.invoice.events
    aggregate_types: [order]`,
		"an invalid type": `
  - name: shop.order.events
    aggregate_types: [Order]`,
	} {
		_, err := Parse([]byte("rollup: {topic: relaybus.ledger.rollup}\ntopics:" + doc + "\n"))
		if err == nil || !strings.Contains(err.Error(), "aggregate_types") {
			t.Errorf("%s: %v, want an error naming aggregate_types", name, err)
		}
	}
}

// Operator grants: a member IAM can name, a role, a scope of valid names.
func TestOperators(t *testing.T) {
	top, err := Parse([]byte(`
rollup: {topic: relaybus.ledger.rollup}
topics: [{name: shop.order.events, consumers: [{service: a}]}]
operators:
  - {member: group:ops@example.com, role: admin}
  - {member: serviceAccount:bot@p.iam.gserviceaccount.com, role: operator, topics: [shop.order.events], consumers: [a]}
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(top.Operators) != 2 || top.Operators[1].Topics[0] != "shop.order.events" {
		t.Errorf("operators %+v", top.Operators)
	}
	for _, bad := range []string{
		`{member: domain:example.com, role: admin}`,
		`{member: alice, role: admin}`,
		`{member: alice@example.com, role: owner}`,
		`{member: alice@example.com, role: viewer, topics: [Shop]}`,
		`{member: alice@example.com, role: viewer, consumers: [A_B]}`,
	} {
		_, err := Parse([]byte("rollup: {topic: relaybus.ledger.rollup}\ntopics: [{name: shop.order.events}]\noperators: [" + bad + "]\n"))
		if err == nil || !strings.Contains(err.Error(), "operators[0]") {
			t.Errorf("%s: %v, want an error naming operators[0]", bad, err)
		}
	}
}
