package dlqreplay_test

import (
	"context"
	"strings"
	"testing"

	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/internal/catalog"
	"github.com/relaybus/relaybus/internal/ledger/consumers"
	"github.com/relaybus/relaybus/internal/registry"
)

// GET /catalog is the repository's topology as internal/catalog models it,
// the compiled schemas included, each consumer with its live registry
// entry: before the deploy's sync nobody is in the registry, after it an
// operator's disable shows with who did it.
func TestCatalogRoute(t *testing.T) {
	e := newEnv(t, dlqreplay.AuthNone, "")
	var got struct {
		Catalog     catalog.Catalog
		SchemaError string
	}
	if st := e.call(t, "GET", "/catalog", nil, &got); st != 200 {
		t.Fatalf("GET /catalog: %d", st)
	}
	if len(got.Catalog.Topics) != len(e.top.Topics) || !got.Catalog.Registry || got.SchemaError != "" {
		t.Fatalf("%d topics (want %d), registry read %v, schema error %q", len(got.Catalog.Topics), len(e.top.Topics), got.Catalog.Registry, got.SchemaError)
	}
	for _, c := range got.Catalog.Topic("shop.order.events").Consumers {
		if c.InRegistry || !c.Declared {
			t.Errorf("%s: in the registry %v before any sync, declared %v", c.Service, c.InRegistry, c.Declared)
		}
	}
	points := got.Catalog.Topic("member.points.events")
	if len(points.Schemas) != 1 || !strings.Contains(points.Schemas[0].Definition, "message PointsAdded") || points.Mode != "binary" {
		t.Fatalf("member.points.events: %+v", points)
	}
	if props, _ := points.Schemas[0].JSONSchema["properties"].(map[string]any); props["memberId"] == nil {
		t.Errorf("v1's JSON Schema %v lacks memberId (protojson's name of member_id)", points.Schemas[0].JSONSchema)
	}
	if p := got.Catalog.Topic("member.points.events").Publishers; len(p) != 1 || p[0].Name != "member-service" || p[0].From != "shop.order.events" {
		t.Errorf("member.points.events' publishers %+v, want member-service handling shop.order.events", p)
	}

	if _, err := consumers.New(e.store.Client(), consumers.Options{}).SyncConsumers(context.Background(), registry.Consumers(e.top), consumers.SyncOptions{}); err != nil {
		t.Fatal(err)
	}
	if st := e.call(t, "POST", "/consumers/shop.order.events/message-service:disable", nil, nil); st != 200 {
		t.Fatalf("disable: %d", st)
	}
	got.Catalog = catalog.Catalog{}
	if st := e.call(t, "GET", "/catalog?topic=shop.order.events", nil, &got); st != 200 || len(got.Catalog.Topics) != 1 {
		t.Fatalf("GET /catalog?topic=shop.order.events: %d, %d topics", st, len(got.Catalog.Topics))
	}
	for _, c := range got.Catalog.Topics[0].Consumers {
		switch {
		case !c.InRegistry || c.Registration == nil:
			t.Errorf("%s: not in the registry after the sync", c.Service)
		case c.Service == "message-service" && (c.Enabled || c.Registration.UpdatedBy == "" || c.Delivery != "eventarc" || c.Ordered):
			t.Errorf("message-service: %+v, want disabled by the caller, Eventarc, unordered", c)
		case c.Service == "member-service" && (!c.Enabled || c.HandlerKind != catalog.KindRegistered || c.Database != "member"):
			t.Errorf("member-service: %+v", c)
		}
	}

	for _, c := range []struct {
		query string
		want  int
		says  string
	}{
		{"?topic=Shop", 400, "topic"},
		{"?topic=shop.nothing.events", 404, "no topic shop.nothing.events"},
		{"?limit=3", 400, "unknown parameter"},
	} {
		var out map[string]any
		if st := e.call(t, "GET", "/catalog"+c.query, nil, &out); st != c.want || !strings.Contains(strings.ToLower(strings.Join([]string{str(out["message"]), fieldsOf(out)}, " ")), strings.ToLower(c.says)) {
			t.Errorf("GET /catalog%s: %d %v, want %d saying %q", c.query, st, out, c.want, c.says)
		}
	}
}

func str(v any) string { s, _ := v.(string); return s }

// fieldsOf joins a 400's fields and their rules.
func fieldsOf(out map[string]any) string {
	var b strings.Builder
	fs, _ := out["fields"].([]any)
	for _, f := range fs {
		m, _ := f.(map[string]any)
		b.WriteString(str(m["field"]) + " " + str(m["rule"]) + " ")
	}
	return b.String()
}
