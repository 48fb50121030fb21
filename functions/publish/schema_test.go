package publish_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/relaybus/relaybus/functions/publish"
	"github.com/relaybus/relaybus/internal/schema"
	"github.com/relaybus/relaybus/shared/topology"
)

// withOrderSchema gives shop.order.events a JSON Schema for v1: orderId a
// string, amount a number of at least 1.
func withOrderSchema(t *testing.T) func(*publish.Options) {
	t.Helper()
	top, err := topology.Parse([]byte(strings.Replace(testTopology, "  - name: shop.order.events\n",
		"  - name: shop.order.events\n    schemas: [{version: v1, type: jsonschema, file: order.json}]\n", 1)))
	if err != nil {
		t.Fatal(err)
	}
	set, err := schema.LoadFrom(top, func(string) ([]byte, error) {
		return []byte(`{"type": "object", "required": ["orderId"], "properties": {
			"orderId": {"type": "string"}, "amount": {"type": "number", "minimum": 1}}}`), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return func(o *publish.Options) { o.Schemas = set }
}

// TestSchemaMismatchIs400AndWritesNothing: a payload that breaks its
// topic's schema, or a schemaVersion the topic does not declare, is
// refused 400 naming the field and the rule, as the other field errors;
// a valid one is accepted.
func TestSchemaMismatchIs400AndWritesNothing(t *testing.T) {
	h := newHarness(t, withOrderSchema(t))
	j := func(v any) []byte { return mustJSON(t, v) }
	jsonCT := []string{"Content-Type", "application/json"}
	cases := []badInput{
		{name: "rule broken", headers: jsonCT, status: 400, code: publish.CodeInvalid,
			body: j(envelope(map[string]any{"payload": map[string]any{"orderId": "o-1", "amount": 0}})), fields: []string{"payload/amount"}},
		{name: "required field missing", headers: jsonCT, status: 400, code: publish.CodeInvalid,
			body: j(envelope(map[string]any{"payload": map[string]any{"amount": 5}})), fields: []string{"payload"}},
		{name: "undeclared version", headers: jsonCT, status: 400, code: publish.CodeInvalid,
			body: j(envelope(map[string]any{"schemaVersion": "v2"})), fields: []string{"schemaVersion"}},
		{name: "batch with one mismatch", headers: jsonCT, status: 400, code: publish.CodeInvalid,
			body:   j([]any{envelope(map[string]any{"aggregateId": "a-1"}), envelope(map[string]any{"aggregateId": "a-2", "payload": map[string]any{"orderId": 7}})}),
			fields: []string{"payload/orderId"}, index: intp(1)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, body, _ := post(t, h.url, tc.body, tc.headers...)
			if status != tc.status {
				t.Fatalf("status %d, want %d: %s", status, tc.status, body)
			}
			e := decodeJSON[publish.ErrorResponse](t, body)
			if e.Error != tc.code {
				t.Fatalf("answer %+v, want error code %s", e, tc.code)
			}
			for _, f := range tc.fields {
				found := false
				for _, p := range e.Fields {
					if p.Field == f && strings.Contains(p.Rule, "topic shop.order.events, schema") &&
						(tc.index == nil || p.Index != nil && *p.Index == *tc.index) {
						found = true
					}
				}
				if !found || !strings.Contains(e.Message, f+":") {
					t.Errorf("field %s with its rule and schema missing from the answer %s", f, body)
				}
			}
		})
	}
	if n := h.rows(t); n != 0 {
		t.Fatalf("%d outbox rows after refused requests", n)
	}
	status, body, _ := post(t, h.url, j(envelope(nil)), jsonCT...)
	if status != http.StatusAccepted {
		t.Fatalf("a payload that keeps the schema: %d %s", status, body)
	}
}
