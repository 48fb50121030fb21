package schema

import (
	"testing"

	"github.com/hamba/avro/v2"
)

// TestAvroValidatesUnionsArraysMapsAndEnums: a valid payload with every
// composite type decodes and writes back to the same bytes, so it is not
// refused as "not exactly one record".
func TestAvroValidatesUnionsArraysMapsAndEnums(t *testing.T) {
	def := `{"type": "record", "name": "Order", "namespace": "shop", "fields": [
		{"name": "id", "type": "string"},
		{"name": "note", "type": ["null", "string"], "default": null},
		{"name": "tags", "type": {"type": "array", "items": "string"}},
		{"name": "attrs", "type": {"type": "map", "values": "long"}},
		{"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["ONLINE", "STORE"]}},
		{"name": "cents", "type": ["null", "long", "double"]},
		{"name": "when", "type": {"type": "long", "logicalType": "timestamp-millis"}}]}`
	s := mustSchema(t, "avro", "binary", def, "")
	parsed := s.v.(*avroSchema).s
	type order struct {
		ID    string           `avro:"id"`
		Note  *string          `avro:"note"`
		Tags  []string         `avro:"tags"`
		Attrs map[string]int64 `avro:"attrs"`
		Kind  string           `avro:"kind"`
		Cents any              `avro:"cents"`
		When  int64            `avro:"when"`
	}
	note := "gift"
	for _, o := range []order{
		{ID: "o-1", Note: &note, Tags: []string{"a", "b"}, Attrs: map[string]int64{"x": 1}, Kind: "STORE", Cents: int64(250), When: 1700000000000},
		{ID: "o-2", Kind: "ONLINE", Cents: nil, When: 1},
	} {
		b, err := avro.Marshal(parsed, o)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Validate(b); err != nil {
			t.Errorf("%s: a valid payload refused: %v", o.ID, err)
		}
	}
}
