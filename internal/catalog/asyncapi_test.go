package catalog

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// The AsyncAPI document, written as YAML and as JSON and parsed back,
// holds what the AsyncAPI 3.0 specification requires of each object it
// uses, every $ref resolves, each operation's messages are its channel's,
// and it says what a reader needs: the payload of each version, the
// headers, the ordering key, and each consumer's delivery and handler.
func TestAsyncAPI(t *testing.T) {
	top, set := fixture(t)
	doc := Build(top, Options{Schemas: set, PullConsumers: []string{"shop.stock.events.stock-service-processor"}}).AsyncAPI(Info{Version: "1.2.3"})
	y, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	j, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	for format, unmarshal := range map[string]func() (map[string]any, error){
		"yaml": func() (m map[string]any, err error) { return m, yaml.Unmarshal(y, &m) },
		"json": func() (m map[string]any, err error) { return m, json.Unmarshal(j, &m) },
	} {
		t.Run(format, func(t *testing.T) {
			d, err := unmarshal()
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range checkAsyncAPI3(d) {
				t.Error(p)
			}
			if got := str(get(d, "info", "version")); got != "1.2.3" {
				t.Errorf("info.version %q", got)
			}
			// One send per topic, one receive per declared consumer.
			ops, _ := d["operations"].(map[string]any)
			if len(ops) != 6+8 {
				t.Errorf("%d operations, want 6 sends and 8 receives", len(ops))
			}
			for _, c := range []struct {
				path []string
				want any
			}{
				{[]string{"operations", "shop.order.events.member-service-processor", "x-relaybus", "emits"}, []any{"member.points.events", "shop.payment.events"}},
				{[]string{"operations", "shop.order.events.message-service-processor", "x-relaybus", "ordered"}, false},
				{[]string{"operations", "shop.order.events.message-service-processor", "x-relaybus", "handlerKind"}, "strict"},
				{[]string{"operations", "shop.stock.events.stock-service-processor", "x-relaybus", "delivery"}, "pull"},
				{[]string{"operations", "shop.order.events.crm-service-forwarder", "x-relaybus", "enabled"}, false},
				{[]string{"operations", "shop.payment.events.send", "action"}, "send"},
				{[]string{"operations", "shop.payment.events.send", "x-relaybus", "publishers"}, []any{map[string]any{"kind": "consumer", "name": "member-service", "from": "shop.order.events"}}},
				{[]string{"channels", "member.points.events", "bindings", "googlepubsub", "schemaSettings", "encoding"}, "JSON"},
				{[]string{"components", "messages", "shop.payment.events.v1", "payload", "schemaFormat"}, FormatAvro},
				{[]string{"components", "messages", "shop.payment.events.v1", "contentType"}, "application/avro"},
				{[]string{"components", "messages", "shop.stock.events.v1", "payload", "schemaFormat"}, FormatProtobuf},
				{[]string{"components", "messages", "member.points.events.v2", "payload", "properties", "orderId", "type"}, "string"},
				{[]string{"components", "messages", "shop.refund.events.v1", "contentType"}, "application/cloudevents+json"},
				{[]string{"components", "messages", "shop.refund.events.v1", "payload", "properties", "data", "required"}, []any{"orderId"}},
				{[]string{"components", "messages", "shop.refund.events.v1", "payload", "properties", "data", "properties", "cents", "$ref"}, "#/components/messages/shop.refund.events.v1/payload/properties/data/$defs/cents"},
				{[]string{"components", "messages", "message.notification.events.v1", "contentType"}, nil}, // no schema: one message, "event"
				{[]string{"components", "messages", "message.notification.events.event", "contentType"}, "application/cloudevents+protobuf"},
				{[]string{"components", "messages", "member.points.events.v1", "headers", "properties", "ce-subject", "description"}, "the aggregate id (the ordering key)"},
				{[]string{"components", "messages", "shop.order.events.event", "headers", "properties", "ce-id"}, nil}, // structured: the envelope has it
				{[]string{"components", "messages", "shop.order.events.event", "payload", "properties", "subject", "description"}, "the aggregate id (the ordering key)"},
				{[]string{"components", "messages", "shop.order.events.event", "x-ordering-key", "header"}, "aggregate_id"},
				{[]string{"components", "messages", "shop.order.events.event", "correlationId", "location"}, "$message.header#/correlation_id"},
			} {
				if got := get(d, c.path...); fmt.Sprint(got) != fmt.Sprint(c.want) {
					t.Errorf("%s: %v, want %v", strings.Join(c.path, "."), got, c.want)
				}
			}
		})
	}
}

// The structural check finds what a broken document breaks, so a pass
// means something.
func TestCheckAsyncAPI3FindsBreakage(t *testing.T) {
	top, set := fixture(t)
	fresh := func() map[string]any {
		b, _ := json.Marshal(Build(top, Options{Schemas: set}).AsyncAPI(Info{}))
		var d map[string]any
		_ = json.Unmarshal(b, &d)
		return d
	}
	for _, c := range []struct {
		name   string
		break_ func(d map[string]any)
		want   string
	}{
		{"version", func(d map[string]any) { d["asyncapi"] = "2.6.0" }, "asyncapi: want 3.0.0"},
		{"info", func(d map[string]any) { delete(get(d, "info").(map[string]any), "title") }, "info.title: required"},
		{"action", func(d map[string]any) {
			get(d, "operations", "shop.order.events.send").(map[string]any)["action"] = "publish"
		}, "operations.shop.order.events.send.action"},
		{"dangling ref", func(d map[string]any) {
			get(d, "channels", "shop.order.events", "messages").(map[string]any)["event"] = map[string]any{"$ref": "#/components/messages/nope"}
		}, "does not resolve"},
		{"foreign message", func(d map[string]any) {
			get(d, "operations", "shop.order.events.send").(map[string]any)["messages"] = []any{map[string]any{"$ref": "#/channels/member.points.events/messages/v1"}}
		}, "not its channel's"},
		{"payload", func(d map[string]any) {
			delete(get(d, "components", "messages", "shop.order.events.event").(map[string]any), "payload")
		}, "payload: required"},
		{"address", func(d map[string]any) { delete(get(d, "channels", "shop.order.events").(map[string]any), "address") }, "address: required"},
	} {
		d := fresh()
		c.break_(d)
		problems := checkAsyncAPI3(d)
		if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, c.want) }) {
			t.Errorf("%s: problems %q, want one saying %q", c.name, problems, c.want)
		}
	}
	if p := checkAsyncAPI3(fresh()); len(p) > 0 {
		t.Errorf("the unbroken document: %q", p)
	}
}

// idRe is the specification's key pattern for channels, operations and
// components.
var idRe = regexp.MustCompile(`^[\w\d.\-_]+$`)

// checkAsyncAPI3 checks the fields AsyncAPI 3.0.0 requires of the objects
// relaybus writes (https://www.asyncapi.com/docs/reference/specification/v3.0.0)
// and that every $ref is a local JSON pointer that resolves.
func checkAsyncAPI3(d map[string]any) []string {
	var p []string
	bad := func(format string, args ...any) { p = append(p, fmt.Sprintf(format, args...)) }
	if d["asyncapi"] != AsyncAPIVersion {
		bad("asyncapi: want %s, not %v", AsyncAPIVersion, d["asyncapi"])
	}
	for _, f := range []string{"title", "version"} {
		if str(get(d, "info", f)) == "" {
			bad("info.%s: required", f)
		}
	}
	for id, s := range asMap(d["servers"]) {
		if str(get(s, "host")) == "" || str(get(s, "protocol")) == "" {
			bad("servers.%s: host and protocol are required", id)
		}
	}
	channels := asMap(d["channels"])
	if len(channels) == 0 {
		bad("channels: none")
	}
	for id, ch := range channels {
		if !idRe.MatchString(id) {
			bad("channels.%s: key does not match %s", id, idRe)
		}
		if _, ok := asMap(ch)["address"].(string); !ok {
			bad("channels.%s.address: required (a string)", id)
		}
		if len(asMap(get(ch, "messages"))) == 0 {
			bad("channels.%s.messages: none", id)
		}
	}
	for id, op := range asMap(d["operations"]) {
		if !idRe.MatchString(id) {
			bad("operations.%s: key does not match %s", id, idRe)
		}
		if a := get(op, "action"); a != "send" && a != "receive" {
			bad("operations.%s.action: must be send or receive, not %v", id, a)
		}
		ch := str(get(op, "channel", "$ref"))
		if !strings.HasPrefix(ch, "#/channels/") {
			bad("operations.%s.channel: must be a $ref to a channel, not %q", id, ch)
		}
		msgs, _ := get(op, "messages").([]any)
		if len(msgs) == 0 {
			bad("operations.%s.messages: none", id)
		}
		for _, m := range msgs {
			if r := str(get(m, "$ref")); !strings.HasPrefix(r, ch+"/messages/") {
				bad("operations.%s.messages: %q is not its channel's (%s)", id, r, ch)
			}
		}
	}
	for id, m := range asMap(get(d, "components", "messages")) {
		if !idRe.MatchString(id) {
			bad("components.messages.%s: key does not match %s", id, idRe)
		}
		mm := asMap(m)
		if _, ok := mm["payload"]; !ok {
			bad("components.messages.%s.payload: required here (every event has one)", id)
		}
		if f, ok := asMap(mm["payload"])["schemaFormat"]; ok && get(mm, "payload", "schema") == nil {
			bad("components.messages.%s.payload: schemaFormat %v without schema", id, f)
		}
		if get(mm, "headers", "type") != "object" {
			bad("components.messages.%s.headers: must be an object schema", id)
		}
		if loc := str(get(mm, "correlationId", "location")); !strings.HasPrefix(loc, "$message.header#/") && !strings.HasPrefix(loc, "$message.payload#/") {
			bad("components.messages.%s.correlationId.location: a runtime expression is required, not %q", id, loc)
		}
	}
	walkRefs(d, d, "", func(where, ref string) { bad("%s: $ref %q does not resolve", where, ref) })
	return p
}

// walkRefs calls broken for every $ref under v that is not a local JSON
// pointer into root that resolves.
func walkRefs(root map[string]any, v any, where string, broken func(where, ref string)) {
	switch x := v.(type) {
	case map[string]any:
		if r, ok := x["$ref"].(string); ok {
			target := any(root)
			if !strings.HasPrefix(r, "#/") {
				target = nil
			} else {
				for _, seg := range strings.Split(r[2:], "/") {
					target = asMap(target)[strings.ReplaceAll(strings.ReplaceAll(seg, "~1", "/"), "~0", "~")]
				}
			}
			if target == nil {
				broken(where, r)
			}
		}
		for k, c := range x {
			walkRefs(root, c, where+"."+k, broken)
		}
	case []any:
		for i, c := range x {
			walkRefs(root, c, fmt.Sprintf("%s[%d]", where, i), broken)
		}
	}
}

func asMap(v any) map[string]any { m, _ := v.(map[string]any); return m }

func str(v any) string { s, _ := v.(string); return s }

// get walks maps by keys; nil when a key is missing.
func get(v any, keys ...string) any {
	for _, k := range keys {
		v = asMap(v)[k]
	}
	return v
}
