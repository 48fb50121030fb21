package schema

import (
	"errors"
	"strings"
	"testing"

	"github.com/hamba/avro/v2"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/topology"
)

// mustSchema compiles one schema as Load would.
func mustSchema(t *testing.T, typ, enc, def, message string) *Schema {
	t.Helper()
	top, err := topology.Parse([]byte(`
rollup: {topic: relaybus.ledger.rollup}
topics:
  - name: shop.order.events
    schemas: [{version: v1, type: ` + typ + `, encoding: ` + enc + `, file: s, message: "` + message + `"}]
`))
	if message == "" {
		top, err = topology.Parse([]byte(`
rollup: {topic: relaybus.ledger.rollup}
topics:
  - name: shop.order.events
    schemas: [{version: v1, type: ` + typ + `, encoding: ` + enc + `, file: s}]
`))
	}
	if err != nil {
		t.Fatal(err)
	}
	set, err := LoadFrom(top, func(string) ([]byte, error) { return []byte(def), nil })
	if err != nil {
		t.Fatal(err)
	}
	s, _ := set.For("shop.order.events", "v1")
	return s
}

const orderProto = `syntax = "proto3";
package shop.v1;
message Order {
  string id = 1;
  int64 cents = 2;
  repeated Item items = 3;
  message Item { string sku = 1; int32 qty = 2; }
}`

func TestValidate(t *testing.T) {
	protoJSON := mustSchema(t, "protobuf", "json", orderProto, "shop.v1.Order")
	protoBin := mustSchema(t, "protobuf", "binary", orderProto, "shop.v1.Order")
	avroDef := `{"type": "record", "name": "Order", "namespace": "shop", "fields": [
		{"name": "id", "type": "string"}, {"name": "cents", "type": "long"}]}`
	avroBin := mustSchema(t, "avro", "binary", avroDef, "")
	js := mustSchema(t, "jsonschema", "json", `{"type": "object", "required": ["id"],
		"properties": {"id": {"type": "string"}, "items": {"type": "array", "items": {"type": "object", "properties": {"qty": {"type": "integer", "minimum": 1}}}}}}`, "")

	good := protowire.AppendTag(nil, 1, protowire.BytesType)
	good = protowire.AppendString(good, "o-1")
	unknownNested := protowire.AppendTag(append([]byte(nil), good...), 3, protowire.BytesType)
	item := protowire.AppendTag(nil, 9, protowire.VarintType)
	item = protowire.AppendVarint(item, 1)
	unknownNested = protowire.AppendBytes(unknownNested, item)
	wrongWire := protowire.AppendTag(nil, 2, protowire.BytesType) // cents is a varint
	wrongWire = protowire.AppendString(wrongWire, "x")

	type order struct {
		ID    string `avro:"id"`
		Cents int64  `avro:"cents"`
	}
	parsed := avroBin.v.(*avroSchema).s
	avroGood, err := avro.Marshal(parsed, order{ID: "o-1", Cents: 5})
	if err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name      string
		s         *Schema
		payload   string
		wantField string // "" = valid
		wantRule  string
	}{
		{"protobuf json valid", protoJSON, `{"id": "o-1", "cents": "12", "items": [{"sku": "a", "qty": 2}]}`, "", ""},
		{"protobuf json unknown field", protoJSON, `{"id": "o-1", "colour": "red"}`, "payload", `unknown field "colour"`},
		{"protobuf json wrong type", protoJSON, `{"id": 5}`, "payload", "id"},
		{"protobuf binary valid", protoBin, string(good), "", ""},
		{"protobuf binary undeclared nested field", protoBin, string(unknownNested), "payload.items[0]", "field number 9"},
		{"protobuf binary wrong wire type", protoBin, string(wrongWire), "payload.cents", "int64"},
		{"avro valid", avroBin, string(avroGood), "", ""},
		{"avro truncated", avroBin, string(avroGood[:len(avroGood)-1]), "payload", "Avro"},
		{"avro trailing bytes", avroBin, string(append(append([]byte(nil), avroGood...), 0x02)), "payload", "exactly one"},
		{"jsonschema valid", js, `{"id": "o-1", "items": [{"qty": 1}]}`, "", ""},
		{"jsonschema missing required", js, `{"items": []}`, "payload", "id"},
		{"jsonschema nested rule", js, `{"id": "o-1", "items": [{"qty": 0}]}`, "payload/items/0/qty", "1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.s.Validate([]byte(tc.payload))
			if tc.wantField == "" {
				if err != nil {
					t.Fatalf("valid payload refused: %v", err)
				}
				return
			}
			var se *Error
			if !errors.As(err, &se) {
				t.Fatalf("got %v, want a *schema.Error", err)
			}
			if se.Field != tc.wantField || !strings.Contains(se.Rule, tc.wantRule) {
				t.Errorf("field %q rule %q; want field %q and a rule mentioning %q", se.Field, se.Rule, tc.wantField, tc.wantRule)
			}
			if !errors.Is(err, event.ErrInvalid) {
				t.Error("a schema error does not match event.ErrInvalid (publish answers it 400)")
			}
			if fes := event.FieldErrors(err); len(fes) != 1 || fes[0].Field != tc.wantField {
				t.Errorf("event.FieldErrors = %v, want one for %s", fes, tc.wantField)
			}
		})
	}
}

func TestSetCheck(t *testing.T) {
	top, err := topology.Parse([]byte(`
rollup: {topic: relaybus.ledger.rollup}
topics:
  - name: shop.order.events
    schemas:
      - {version: v1, type: protobuf, file: v1.proto, message: shop.v1.Order}
      - {version: v2, type: protobuf, file: v2.proto, message: shop.v1.Order}
  - name: shop.cart.events
    schemas: [{version: v1, type: protobuf, encoding: binary, file: v1.proto, message: shop.v1.Order}]
  - name: shop.stock.events
`))
	if err != nil {
		t.Fatal(err)
	}
	set, err := LoadFrom(top, func(string) ([]byte, error) { return []byte(orderProto), nil })
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name      string
		e         event.Event
		wantField string
	}{
		{"declared version", event.Event{Topic: "shop.order.events", SchemaVersion: "v2", Payload: []byte(`{"id": "x"}`)}, ""},
		{"empty version is v1", event.Event{Topic: "shop.order.events", Payload: []byte(`{"id": "x"}`)}, ""},
		{"undeclared version", event.Event{Topic: "shop.order.events", SchemaVersion: "v3", Payload: []byte(`{"id": "x"}`)}, "schemaVersion"},
		{"binary payload on a json topic", event.Event{Topic: "shop.order.events", PayloadType: "application/protobuf", Payload: []byte{}}, "payloadType"},
		{"json payload on a binary topic", event.Event{Topic: "shop.cart.events", PayloadType: "application/json", Payload: []byte(`{}`)}, "payloadType"},
		{"topic without schemas", event.Event{Topic: "shop.stock.events", Payload: []byte(`anything`), PayloadType: "text/plain"}, ""},
		{"undeclared topic", event.Event{Topic: "shop.other.events", Payload: []byte(`{}`)}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := set.Check(&tc.e)
			var se *Error
			switch {
			case tc.wantField == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.wantField != "" && !errors.As(err, &se):
				t.Fatalf("got %v, want a *schema.Error on %s", err, tc.wantField)
			case tc.wantField != "" && se.Field != tc.wantField:
				t.Errorf("field %s (%s), want %s", se.Field, se.Rule, tc.wantField)
			}
		})
	}
	if got := strings.Join(set.Versions("shop.order.events"), ","); got != "v1,v2" {
		t.Errorf("Versions = %s", got)
	}
}

func TestLoadRefusesImportsAndUnknownMessages(t *testing.T) {
	top, err := topology.Parse([]byte(`
rollup: {topic: relaybus.ledger.rollup}
topics:
  - name: shop.order.events
    schemas: [{version: v1, type: protobuf, file: a.proto, message: shop.v1.Nope}]
  - name: shop.cart.events
    schemas: [{version: v1, type: protobuf, file: b.proto, message: shop.v1.Order}]
  - name: shop.stock.events
    schemas: [{version: v1, type: protobuf, file: c.proto, message: shop.v1.Order}]
`))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"a.proto":      orderProto,
		"b.proto":      `syntax = "proto3"; package shop.v1; import "common.proto"; message Order { Money m = 1; }`,
		"common.proto": `syntax = "proto3"; package shop.v1; message Money { int64 cents = 1; }`,
		"c.proto":      `syntax = "proto3"; package shop.v1; message Money { int64 cents = 1; } message Order { Money m = 1; }`,
	}
	_, err = LoadFrom(top, func(name string) ([]byte, error) { return []byte(files[name]), nil })
	if err == nil {
		t.Fatal("loaded")
	}
	for _, want := range []string{"topics[0] (shop.order.events).schemas[0] (v1)", "one top-level message, shop.v1.Nope", "topics[1] (shop.cart.events)", "imports common.proto",
		"topics[2] (shop.stock.events)", "declares 2 top-level message(s)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}

// BenchmarkCheckProtobufJSON is the work a schema adds to each send:
// BenchmarkPublish's 161-byte payload checked against a protobuf schema
// (JSON encoding) with protojson and a compiled descriptor.
func BenchmarkCheckProtobufJSON(b *testing.B) {
	top, err := topology.Parse([]byte(`
rollup: {topic: relaybus.ledger.rollup}
topics:
  - name: shop.order.events
    schemas: [{version: v1, type: protobuf, file: o.proto, message: shop.v1.OrderPurchased}]
`))
	if err != nil {
		b.Fatal(err)
	}
	set, err := LoadFrom(top, func(string) ([]byte, error) {
		return []byte(`syntax = "proto3"; package shop.v1;
message OrderPurchased {
  string order_id = 1; double amount = 2; string currency = 3;
  message Item { string sku = 1; int32 qty = 2; }
  repeated Item items = 4;
  message Customer { string id = 1; string tier = 2; }
  Customer customer = 5;
}`), nil
	})
	if err != nil {
		b.Fatal(err)
	}
	e := &event.Event{Topic: "shop.order.events", SchemaVersion: "v1", PayloadType: "application/json",
		Payload: []byte(`{"orderId":"ORD-2026-000001","amount":99.5,"currency":"EUR","items":[{"sku":"SKU-1","qty":2},{"sku":"SKU-2","qty":1}],"customer":{"id":"user-123","tier":"gold"}}`)}
	b.ReportAllocs()
	for b.Loop() {
		if err := set.Check(e); err != nil {
			b.Fatal(err)
		}
	}
}
