package catalog

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/schema"
	"github.com/relaybus/relaybus/shared/topology"
)

// fixture loads testdata/topology.yaml and its schemas.
func fixture(t *testing.T) (*topology.Topology, *schema.Set) {
	t.Helper()
	top, err := topology.Load("testdata/topology.yaml")
	if err != nil {
		t.Fatal(err)
	}
	set, err := schema.Load(top)
	if err != nil {
		t.Fatal(err)
	}
	return top, set
}

// Build says, per topic, how its events are written, which versions they
// have, who sends them and who takes them how: each case one fact a reader
// of the catalog relies on.
func TestBuild(t *testing.T) {
	top, set := fixture(t)
	at := time.Date(2026, 11, 1, 9, 0, 0, 0, time.UTC)
	c := Build(top, Options{Schemas: set, PullConsumers: []string{"shop.stock.events.stock-service-processor"},
		Registry: []Registration{
			{Topic: "shop.order.events", ConsumerID: "member-service", Enabled: true, UpdatedAt: at},
			{Topic: "shop.order.events", ConsumerID: "message-service", Enabled: false, UpdatedAt: at, UpdatedBy: "olga@example.com"},
			{Topic: "shop.order.events", ConsumerID: "billing-service", Enabled: true, UpdatedAt: at, UpdatedBy: "alice@example.com"},
		}})
	consumer := func(topic, service string) Consumer {
		t.Helper()
		tp := c.Topic(topic)
		if tp == nil {
			t.Fatalf("no topic %s", topic)
		}
		for _, cc := range tp.Consumers {
			if cc.Service == service {
				return cc
			}
		}
		t.Fatalf("no consumer %s of %s", service, topic)
		return Consumer{}
	}
	for _, tc := range []struct {
		name string
		got  any
		want any
	}{
		{"topics in the topology's order", topicNames(c), []string{"shop.order.events", "member.points.events", "message.notification.events", "shop.payment.events", "shop.refund.events", "shop.stock.events"}},
		{"the rollup topic is named, not listed", c.RollupTopic, "relaybus.ledger.rollup"},
		{"no schema: structured JSON", []string{c.Topic("shop.order.events").Mode, c.Topic("shop.order.events").ContentType}, []string{"structured", "application/cloudevents+json"}},
		{"encoding protobuf: structured protobuf", c.Topic("message.notification.events").ContentType, "application/cloudevents+protobuf"},
		{"a Pub/Sub schema: binary mode", []string{c.Topic("member.points.events").Mode, c.Topic("shop.payment.events").Mode, c.Topic("shop.stock.events").Mode}, []string{"binary", "binary", "binary"}},
		{"a JSON Schema has no Pub/Sub schema: structured", c.Topic("shop.refund.events").Mode, "structured"},
		{"versions oldest first", versions(c.Topic("member.points.events")), []string{"v1", "v2"}},
		{"payload types", []string{c.Topic("member.points.events").Schemas[0].PayloadType, c.Topic("shop.payment.events").Schemas[0].PayloadType, c.Topic("shop.stock.events").Schemas[0].PayloadType, c.Topic("shop.refund.events").Schemas[0].PayloadType},
			[]string{"application/json", "application/avro", "application/protobuf", "application/json"}},
		{"v2's JSON Schema has its new field", hasProperty(c.Topic("member.points.events").Schemas[1], "orderId"), true},
		{"v1's has not", hasProperty(c.Topic("member.points.events").Schemas[0], "orderId"), false},
		{"Avro: its own schema, no JSON Schema", []any{c.Topic("shop.payment.events").Schemas[0].JSONSchema == nil, strings.Contains(c.Topic("shop.payment.events").Schemas[0].Definition, `"Payment"`)}, []any{true, true}},
		{"aggregate types default to the name's segment", c.Topic("shop.order.events").AggregateTypes, []string{"order"}},
		{"ledger default", []string{c.Topic("shop.order.events").Ledger, c.Topic("member.points.events").Ledger}, []string{"failures", "full"}},
		{"dead-letter topic", c.Topic("shop.order.events").DeadLetterTopic, "shop.order.events.dlq"},
		{"HTTP publishers as emails", c.Topic("shop.order.events").Publishers, []Publisher{{Kind: PublisherHTTP, Name: "checkout@p.iam.gserviceaccount.com"}}},
		{"emitting consumers publish", c.Topic("shop.payment.events").Publishers, []Publisher{{Kind: PublisherConsumer, Name: "member-service", From: "shop.order.events"}}},
		{"no declared publisher", c.Topic("shop.refund.events").Publishers, []Publisher{}},
		{"push: ordered", []any{consumer("shop.order.events", "member-service").Delivery, consumer("shop.order.events", "member-service").Ordered}, []any{"push", true}},
		{"eventarc: unordered", []any{consumer("shop.order.events", "message-service").Delivery, consumer("shop.order.events", "message-service").Ordered}, []any{"eventarc", false}},
		{"pull mode: pull, ordered", []any{consumer("shop.stock.events", "stock-service").Delivery, consumer("shop.stock.events", "stock-service").Ordered}, []any{"pull", true}},
		{"handler kinds", []string{consumer("shop.order.events", "member-service").HandlerKind, consumer("shop.order.events", "message-service").HandlerKind,
			consumer("shop.order.events", "crm-service").HandlerKind, consumer("member.points.events", "audit-service").HandlerKind}, []string{"registered", "strict", "forward", "projection"}},
		{"what a consumer emits", consumer("shop.order.events", "member-service").Emits, []string{"member.points.events", "shop.payment.events"}},
		{"the registry decides enabled", consumer("shop.order.events", "message-service").Enabled, false},
		{"an operator's change is shown", consumer("shop.order.events", "message-service").Registration.UpdatedBy, "olga@example.com"},
		{"declared but not in the registry", []any{consumer("shop.order.events", "crm-service").InRegistry, consumer("shop.order.events", "crm-service").Registration == nil}, []any{false, true}},
		{"in the registry, not declared: no subscription", []any{consumer("shop.order.events", "billing-service").Declared, consumer("shop.order.events", "billing-service").Subscription, consumer("shop.order.events", "billing-service").Enabled}, []any{false, "", true}},
		{"subscription and dead letters", []any{consumer("shop.order.events", "crm-service").Subscription, consumer("shop.order.events", "crm-service").MaxDeliveryAttempts}, []any{"shop.order.events.crm-service-forwarder", 5}},
		{"a forward consumer's target", consumer("shop.order.events", "crm-service").ForwardURL, "https://crm.example.com/hooks"},
	} {
		if !reflect.DeepEqual(tc.got, tc.want) {
			t.Errorf("%s: got %#v, want %#v", tc.name, tc.got, tc.want)
		}
	}
}

// Without the registry or the schemas the catalog is the topology's:
// enabled as declared, nobody "missing from the registry", versions
// without definitions.
func TestBuildFromTheTopologyAlone(t *testing.T) {
	top, _ := fixture(t)
	c := Build(top, Options{})
	if c.Registry {
		t.Error("Registry set with no registry read")
	}
	tp := c.Topic("shop.order.events")
	if len(tp.Consumers) != 3 || tp.Consumers[2].Enabled || !tp.Consumers[0].Enabled {
		t.Errorf("consumers %+v: want the three declared, crm-service disabled as declared", tp.Consumers)
	}
	s := c.Topic("member.points.events").Schemas[0]
	if s.Definition != "" || s.JSONSchema != nil || s.Version != "v1" || s.Message != "shop.v1.Points" {
		t.Errorf("schema %+v: want the declaration only", s)
	}
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "null") {
		t.Errorf("the JSON has a null where a list belongs: %s", b)
	}
}

func topicNames(c *Catalog) []string {
	var out []string
	for _, t := range c.Topics {
		out = append(out, t.Name)
	}
	return out
}

func versions(t *Topic) []string {
	var out []string
	for _, s := range t.Schemas {
		out = append(out, s.Version)
	}
	return out
}

func hasProperty(s Schema, name string) bool {
	props, _ := s.JSONSchema["properties"].(map[string]any)
	_, ok := props[name]
	return ok
}
