package schema

import (
	"encoding/json"
	"strings"
	"testing"
)

// JSONSchema describes each schema type's payload as a reader of the
// catalog needs it: a protobuf message in protojson's names and value
// forms, a JSON Schema as written, Avro not at all (its own schema is the
// description).
func TestJSONSchema(t *testing.T) {
	const tree = `syntax = "proto3";
package shop.v1;
message Node {
  string node_id = 1;
  int64 weight = 2;
  uint32 rank = 3;
  bytes blob = 4;
  double score = 5;
  bool leaf = 6;
  Kind kind = 7;
  repeated Node children = 8;
  map<string, Tag> tags = 9;
  enum Kind { KIND_UNSPECIFIED = 0; BRANCH = 1; }
  message Tag { string value = 1; }
}`
	for _, c := range []struct {
		name, typ, enc, def, message string
		want                         string // the document, as JSON; "" for none
		payloadType                  string
	}{
		{"protobuf json", "protobuf", "json", tree, "shop.v1.Node",
			`{"properties":{"blob":{"contentEncoding":"base64","type":"string"},` +
				`"children":{"items":{"description":"a shop.v1.Node (recursive: described above)","type":"object"},"type":"array"},` +
				`"kind":{"enum":["KIND_UNSPECIFIED","BRANCH"],"title":"shop.v1.Node.Kind","type":"string"},` +
				`"leaf":{"type":"boolean"},"nodeId":{"type":"string"},"rank":{"format":"uint32","minimum":0,"type":"integer"},` +
				`"score":{"description":"a number, or \"NaN\", \"Infinity\", \"-Infinity\"","type":["number","string"]},` +
				`"tags":{"additionalProperties":{"properties":{"value":{"type":"string"}},"title":"shop.v1.Node.Tag","type":"object"},"type":"object"},` +
				`"weight":{"description":"a 64-bit integer: protojson writes a string of digits and reads either","format":"int64","type":["string","integer"]}},` +
				`"title":"shop.v1.Node","type":"object"}`, "application/json"},
		{"protobuf binary", "protobuf", "binary", tree, "shop.v1.Node", "", "application/protobuf"},
		{"json schema", "jsonschema", "json", `{"type": "object", "required": ["id"], "properties": {"id": {"type": "string"}}}`, "",
			`{"properties":{"id":{"type":"string"}},"required":["id"],"type":"object"}`, "application/json"},
		{"avro", "avro", "binary", `{"type": "record", "name": "Order", "fields": [{"name": "id", "type": "string"}]}`, "", "", "application/avro"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := mustSchema(t, c.typ, c.enc, c.def, c.message)
			if got := s.PayloadType(); got != c.payloadType {
				t.Errorf("PayloadType %q, want %q", got, c.payloadType)
			}
			doc, ok := s.JSONSchema()
			if c.typ == "avro" {
				if ok {
					t.Errorf("an Avro schema has a JSON Schema: %v", doc)
				}
				return
			}
			if !ok {
				t.Fatal("no JSON Schema")
			}
			if c.typ == "protobuf" {
				if !strings.Contains(doc["$comment"].(string), "protojson") {
					t.Errorf("$comment %q does not say the mapping", doc["$comment"])
				}
				delete(doc, "$comment")
			}
			b, _ := json.Marshal(doc)
			want := c.want
			if want == "" { // binary protobuf: the same fields as JSON
				want = string(mustJSON(t, mustSchema(t, "protobuf", "json", c.def, c.message)))
			}
			if string(b) != want {
				t.Errorf("JSON Schema\n%s\nwant\n%s", b, want)
			}
			if strings.Contains(string(b), "$ref") {
				t.Error("the document is not self-contained")
			}
		})
	}
}

func mustJSON(t *testing.T, s *Schema) []byte {
	doc, _ := s.JSONSchema()
	delete(doc, "$comment")
	b, _ := json.Marshal(doc)
	return b
}
