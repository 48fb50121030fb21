package schema

import (
	"strings"
	"testing"
)

// TestCompare: one forbidden and one allowed change of each kind per
// format, as `relaybus schemas check` reports them.
func TestCompare(t *testing.T) {
	const protoBase = `syntax = "proto3";
package shop.v1;
message Order {
  enum Kind { KIND_UNSPECIFIED = 0; ONLINE = 1; STORE = 2; }
  message Address { string city = 1; string zip = 2; }
  string id = 1;
  int64 cents = 2;
  repeated string tags = 3;
  Kind kind = 4;
  Address address = 5;
}`
	const proto2Base = `syntax = "proto2";
package shop.v1;
message Order { optional string id = 1; optional int64 cents = 2; }`
	const avroBase = `{"type": "record", "name": "Order", "namespace": "shop", "fields": [
	{"name": "id", "type": "string"},
	{"name": "cents", "type": "long"},
	{"name": "note", "type": ["null", "string"], "default": null}]}`
	const jsonBase = `{"type": "object", "required": ["id"], "properties": {
	"id": {"type": "string"},
	"cents": {"type": "integer"},
	"note": {"type": "string"},
	"address": {"type": "object", "properties": {"city": {"type": "string"}}}}}`

	cases := []struct {
		name         string
		typ, enc     string
		old, new     string
		wantKind     string // "" = allowed
		wantField    string
		wantInDetail string
	}{
		// protobuf
		{"protobuf: optional field added", "protobuf", "json", protoBase,
			strings.Replace(protoBase, "Address address = 5;", "Address address = 5;\n  string note = 6;", 1), "", "", ""},
		{"protobuf: enum value added", "protobuf", "json", protoBase,
			strings.Replace(protoBase, "STORE = 2;", "STORE = 2; PHONE = 3;", 1), "", "", ""},
		{"protobuf: field removed", "protobuf", "json", protoBase,
			strings.Replace(protoBase, "int64 cents = 2;", "", 1), ChangeRemoved, "Order.cents", "field 2"},
		{"protobuf: nested field removed", "protobuf", "json", protoBase,
			strings.Replace(protoBase, " string zip = 2;", "", 1), ChangeRemoved, "Order.address.zip", ""},
		{"protobuf: type changed", "protobuf", "json", protoBase,
			strings.Replace(protoBase, "int64 cents = 2;", "string cents = 2;", 1), ChangeType, "Order.cents", "int64 became string"},
		{"protobuf: repeated made singular", "protobuf", "json", protoBase,
			strings.Replace(protoBase, "repeated string tags = 3;", "string tags = 3;", 1), ChangeType, "Order.tags", "repeated string"},
		{"protobuf: renumbered", "protobuf", "json", protoBase,
			strings.Replace(protoBase, "int64 cents = 2;", "int64 cents = 7;", 1), ChangeNumber, "Order.cents", "2 became 7"},
		{"protobuf: renamed under json", "protobuf", "json", protoBase,
			strings.Replace(protoBase, "int64 cents = 2;", "int64 amount = 2;", 1), ChangeRenamed, "Order.cents", "amount"},
		{"protobuf: renamed under binary is allowed", "protobuf", "binary", protoBase,
			strings.Replace(protoBase, "int64 cents = 2;", "int64 amount = 2;", 1), "", "", ""},
		{"protobuf: enum value removed", "protobuf", "json", protoBase,
			strings.Replace(protoBase, " STORE = 2;", "", 1), ChangeRemoved, "Order.kind", "STORE"},
		{"protobuf: optional made required", "protobuf", "binary", proto2Base,
			strings.Replace(proto2Base, "optional string id", "required string id", 1), ChangeRequired, "Order.id", ""},
		{"protobuf: new required field", "protobuf", "binary", proto2Base,
			strings.Replace(proto2Base, "optional int64 cents = 2;", "optional int64 cents = 2; required string note = 3;", 1), ChangeRequired, "Order.note", "new field"},
		{"protobuf: optional field added (proto2)", "protobuf", "binary", proto2Base,
			strings.Replace(proto2Base, "optional int64 cents = 2;", "optional int64 cents = 2; optional string note = 3;", 1), "", "", ""},

		// Avro
		{"avro: field with a default added", "avro", "binary", avroBase,
			strings.Replace(avroBase, `"default": null}]`, `"default": null}, {"name": "channel", "type": "string", "default": "web"}]`, 1), "", "", ""},
		{"avro: field removed", "avro", "binary", avroBase,
			strings.Replace(avroBase, `{"name": "cents", "type": "long"},`, "", 1), ChangeRemoved, "shop.Order.cents", ""},
		{"avro: field removed, old readers refuse", "avro", "binary", avroBase,
			strings.Replace(avroBase, `{"name": "cents", "type": "long"},`, "", 1), ChangeIncompatible, "", "old schema"},
		{"avro: type changed", "avro", "binary", avroBase,
			strings.Replace(avroBase, `"name": "cents", "type": "long"`, `"name": "cents", "type": "string"`, 1), ChangeIncompatible, "", ""},
		{"avro: optional made required", "avro", "binary", avroBase,
			strings.Replace(avroBase, `"type": ["null", "string"], "default": null`, `"type": "string"`, 1), ChangeIncompatible, "", "new schema"},
		{"avro: new field without a default", "avro", "binary", avroBase,
			strings.Replace(avroBase, `"default": null}]`, `"default": null}, {"name": "channel", "type": "string"}]`, 1), ChangeIncompatible, "", "new schema"},

		// JSON Schema
		{"jsonschema: optional property added", "jsonschema", "json", jsonBase,
			strings.Replace(jsonBase, `"note": {"type": "string"},`, `"note": {"type": "string"}, "channel": {"type": "string"},`, 1), "", "", ""},
		{"jsonschema: property removed", "jsonschema", "json", jsonBase,
			strings.Replace(jsonBase, `"cents": {"type": "integer"},`, "", 1), ChangeRemoved, "/cents", ""},
		{"jsonschema: nested property removed", "jsonschema", "json", jsonBase,
			strings.Replace(jsonBase, `"properties": {"city": {"type": "string"}}`, `"properties": {}`, 1), ChangeRemoved, "/address/city", ""},
		{"jsonschema: type changed", "jsonschema", "json", jsonBase,
			strings.Replace(jsonBase, `"cents": {"type": "integer"}`, `"cents": {"type": "string"}`, 1), ChangeType, "/cents", "integer became string"},
		{"jsonschema: type widened is still a change", "jsonschema", "json", jsonBase,
			strings.Replace(jsonBase, `"cents": {"type": "integer"}`, `"cents": {"type": ["integer", "null"]}`, 1), ChangeType, "/cents", ""},
		{"jsonschema: optional made required", "jsonschema", "json", jsonBase,
			strings.Replace(jsonBase, `"required": ["id"]`, `"required": ["id", "note"]`, 1), ChangeRequired, "/note", "optional property"},
		{"jsonschema: new required property", "jsonschema", "json", jsonBase,
			strings.Replace(strings.Replace(jsonBase, `"required": ["id"]`, `"required": ["id", "channel"]`, 1), `"note": {"type": "string"},`, `"note": {"type": "string"}, "channel": {"type": "string"},`, 1), ChangeRequired, "/channel", "new property"},
		{"jsonschema: description changed", "jsonschema", "json", jsonBase,
			strings.Replace(jsonBase, `"id": {"type": "string"}`, `"id": {"type": "string", "description": "the order"}`, 1), "", "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			msg := ""
			if tc.typ == "protobuf" {
				msg = "shop.v1.Order"
			}
			old := mustSchema(t, tc.typ, tc.enc, tc.old, msg)
			new := mustSchema(t, tc.typ, tc.enc, tc.new, msg)
			changes := Compare(old, new)
			if tc.wantKind == "" {
				if len(changes) > 0 {
					t.Fatalf("an allowed change refused: %v", changes)
				}
				return
			}
			for _, c := range changes {
				if c.Kind == tc.wantKind && c.Field == tc.wantField && strings.Contains(c.Detail, tc.wantInDetail) {
					return
				}
			}
			t.Errorf("want %s on %q (detail with %q), got %v", tc.wantKind, tc.wantField, tc.wantInDetail, changes)
		})
	}
}

func TestCompareRefusesAFormatChange(t *testing.T) {
	a := mustSchema(t, "protobuf", "json", `syntax = "proto3"; package p; message M { string id = 1; }`, "p.M")
	b := mustSchema(t, "protobuf", "binary", `syntax = "proto3"; package p; message M { string id = 1; }`, "p.M")
	if c := Compare(a, b); len(c) != 1 || c[0].Kind != ChangeFormat {
		t.Errorf("json to binary: %v, want a format change", c)
	}
}
