package topology

import (
	"strings"
	"testing"
)

// TestSchemaDeclarationsAreValidated: each mistake in a topic's schemas is
// refused with the field's path and the rule; defaults are applied.
func TestSchemaDeclarationsAreValidated(t *testing.T) {
	doc := func(schemas string) string {
		return "rollup: {topic: relaybus.ledger.rollup}\ntopics:\n  - name: shop.order.events\n    schemas:\n" + schemas
	}
	for _, c := range []struct {
		name, schemas, field, rule string
	}{
		{"bad version", "      - {version: 1, type: protobuf, file: a.proto, message: p.M}\n", "schemas[0] (1).version", "v followed by a number"},
		{"version twice", "      - {version: v1, type: jsonschema, file: a.json}\n      - {version: v1, type: jsonschema, file: b.json}\n", "schemas[1] (v1).version", "declared twice"},
		{"unknown type", "      - {version: v1, type: thrift, file: a.thrift}\n", "schemas[0] (v1).type", "protobuf, avro or jsonschema"},
		{"protobuf without message", "      - {version: v1, type: protobuf, file: a.proto}\n", "schemas[0] (v1).message", "full name"},
		{"message on avro", "      - {version: v1, type: avro, file: a.avsc, message: p.M}\n", "schemas[0] (v1).message", "only type protobuf"},
		{"no file", "      - {version: v1, type: jsonschema}\n", "schemas[0] (v1).file", "required"},
		{"file outside", "      - {version: v1, type: jsonschema, file: ../secrets.json}\n", "schemas[0] (v1).file", "relative path inside"},
		{"bad encoding", "      - {version: v1, type: protobuf, file: a.proto, message: p.M, encoding: xml}\n", "schemas[0] (v1).encoding", "json or binary"},
		{"binary jsonschema", "      - {version: v1, type: jsonschema, file: a.json, encoding: binary}\n", "schemas[0] (v1).encoding", "must be json"},
		{"json avro", "      - {version: v1, type: avro, file: a.avsc, encoding: json}\n", "schemas[0] (v1).encoding", "binary"},
		{"mixed types", "      - {version: v1, type: jsonschema, file: a.json}\n      - {version: v2, type: protobuf, file: a.proto, message: p.M}\n", "schemas[1] (v2)", "same type and encoding"},
		{"unknown key", "      - {version: v1, type: jsonschema, file: a.json, format: x}\n", "", "format"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte(doc(c.schemas)))
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), c.field) || !strings.Contains(err.Error(), c.rule) {
				t.Errorf("error %q lacks %q and %q", err, c.field, c.rule)
			}
		})
	}
	top, err := Parse([]byte(doc("      - {version: v1, type: avro, file: a.avsc}\n      - {version: v2, type: avro, file: b.avsc}\n")))
	if err != nil {
		t.Fatal(err)
	}
	tp := top.Topic("shop.order.events")
	if s, ok := tp.SchemaFor("v2"); !ok || s.Encoding != SchemaEncodingBinary || s.File != "b.avsc" {
		t.Errorf("v2: %+v %v, want avro with the binary encoding by default", s, ok)
	}
	if _, ok := tp.SchemaFor("v3"); ok {
		t.Error("v3 found")
	}
}
