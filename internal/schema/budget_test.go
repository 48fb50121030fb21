package schema

import (
	"bytes"
	"errors"
	"math/rand"
	"runtime"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

// avroLong is n in Avro's binary encoding (zig-zag varint).
func avroLong(b []byte, n int64) []byte { return protowire.AppendVarint(b, protowire.EncodeZigZag(n)) }

const recursiveProto = `syntax = "proto3";
package shop.v1;
message Node {
  Node next = 1;
  repeated Node children = 2;
  repeated int64 counts = 3;
  repeated string tags = 4;
}`

// nestedProto is n Nodes each in the previous one's next.
func nestedProto(n int) []byte {
	var b []byte
	for i := 0; i < n; i++ {
		b = protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), b)
	}
	return b
}

// emptyChildren is n empty Nodes in children: two bytes each, an allocated
// message each when decoded.
func emptyChildren(n int) []byte {
	var b []byte
	for i := 0; i < n; i++ {
		b = protowire.AppendBytes(protowire.AppendTag(b, 2, protowire.BytesType), nil)
	}
	return b
}

// TestDecodingBudgets: a payload that would cost a decoder far more than
// its size (many zero-width items, deep nesting, a huge count in a few
// bytes) is refused naming the limit it breaks, for every schema kind;
// the same shapes within the limits pass.
func TestDecodingBudgets(t *testing.T) {
	small := Limits{MaxBytes: 4096, MaxDepth: 8, MaxItems: 1000}
	avroNulls := mustSchema(t, "avro", "binary", `{"type": "record", "name": "R", "fields": [{"name": "a", "type": {"type": "array", "items": "null"}}]}`, "")
	avroEmpty := mustSchema(t, "avro", "binary", `{"type": "record", "name": "R", "fields": [{"name": "a", "type": {"type": "array", "items": {"type": "record", "name": "E", "fields": []}}}]}`, "")
	avroMap := mustSchema(t, "avro", "binary", `{"type": "record", "name": "R", "fields": [{"name": "m", "type": {"type": "map", "values": "null"}}]}`, "")
	avroList := mustSchema(t, "avro", "binary", `{"type": "record", "name": "L", "fields": [{"name": "next", "type": ["null", "L"]}]}`, "")
	protoBin := mustSchema(t, "protobuf", "binary", recursiveProto, "shop.v1.Node")
	protoJSON := mustSchema(t, "protobuf", "json", recursiveProto, "shop.v1.Node")
	js := mustSchema(t, "jsonschema", "json", `{"type": "array", "uniqueItems": true}`, "")
	jsAny := mustSchema(t, "jsonschema", "json", `{}`, "")

	// The linked list L, n deep: n times branch 1, then branch 0 (null).
	list := func(n int) []byte {
		var b []byte
		for i := 0; i < n; i++ {
			b = avroLong(b, 1)
		}
		return avroLong(b, 0)
	}
	// n nulls in one block; with size, the block's byte size too.
	nulls := func(n int64, size bool) []byte {
		if size {
			return avroLong(avroLong(avroLong(nil, -n), 0), 0)
		}
		return avroLong(avroLong(nil, n), 0)
	}
	packed := protowire.AppendTag(nil, 3, protowire.BytesType)
	packed = protowire.AppendBytes(packed, bytes.Repeat([]byte{1}, 2000))
	strs := protowire.AppendTag(nil, 4, protowire.BytesType)
	strs = protowire.AppendString(strs, strings.Repeat("x", 300)) // one string of 300 bytes: one value

	cases := []struct {
		name    string
		s       *Schema
		payload []byte
		rule    string // "" = within the limits (the schema's own verdict aside)
	}{
		{"avro 999 nulls and the field", avroNulls, nulls(999, false), ""},
		{"avro 1001 nulls", avroNulls, nulls(1001, false), "more than 1000 values"},
		{"avro 2^31 nulls in 5 bytes", avroNulls, nulls(1<<31-1, false), "more than 1000 values"},
		{"avro nulls in a sized block", avroNulls, nulls(5000, true), "more than 1000 values"},
		{"avro many small blocks", avroNulls, append(bytes.Repeat(avroLong(nil, 100), 11), 0), "more than 1000 values"},
		{"avro empty records", avroEmpty, nulls(1<<20, false), "more than 1000 values"},
		{"avro map of nulls", avroMap, nulls(1<<20, false), "more than 1000 values"},
		{"avro list 3 deep", avroList, list(3), ""},
		{"avro list 7 deep", avroList, list(7), ""},
		{"avro list 8 deep", avroList, list(8), "deeper than 8 levels"},
		{"avro count past the end", avroNulls, avroLong(nil, 5), "ends or breaks at byte 1"},
		{"avro varint of eleven bytes", avroNulls, bytes.Repeat([]byte{0xff}, 11), "ends or breaks at byte 0"},
		{"avro over MaxBytes", avroNulls, make([]byte, 4097), "4097 bytes, over the 4096"},
		{"protobuf 400 empty children", protoBin, emptyChildren(400), ""},
		{"protobuf 1001 empty children", protoBin, emptyChildren(1001), "more than 1000 values"},
		{"protobuf 7 nested", protoBin, nestedProto(7), ""},
		{"protobuf 9 nested", protoBin, nestedProto(9), "deeper than 8 levels"},
		{"protobuf 2000 packed", protoBin, packed, "more than 1000 values"},
		{"protobuf one long string", protoBin, strs, ""},
		{"protobuf json 1001 children", protoJSON, []byte(`{"children": [` + strings.Repeat(`{},`, 1000) + `{}]}`), "more than 1000 values"},
		{"protobuf json 9 nested", protoJSON, []byte(strings.Repeat(`{"next": `, 9) + `{}` + strings.Repeat(`}`, 9)), "deeper than 8 levels"},
		{"protobuf json commas in strings", protoJSON, []byte(`{"tags": ["` + strings.Repeat(`,[{`, 1000) + `"]}`), ""},
		{"jsonschema 1001 items", js, []byte(`[` + strings.Repeat(`0,`, 1000) + `1]`), "more than 1000 values"},
		{"jsonschema 999 items", js, []byte(`[` + strings.Repeat(`[],`, 499) + `0]`), ""},
		{"jsonschema 9 deep", jsAny, []byte(strings.Repeat(`[`, 9) + strings.Repeat(`]`, 9)), "deeper than 8 levels"},
		{"jsonschema escaped quote", jsAny, []byte(`["\"[[[[[[[[[[", 1]`), ""},
		{"jsonschema over MaxBytes", jsAny, []byte(`"` + strings.Repeat("a", 4096) + `"`), "4098 bytes, over the 4096"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := *tc.s
			s.limits = small
			err := s.Validate(tc.payload)
			if tc.rule == "" {
				var se *Error
				if errors.As(err, &se) && (strings.Contains(se.Rule, "relaybus checks") || strings.Contains(se.Rule, "over the")) {
					t.Fatalf("refused by a limit within the limits: %v", err)
				}
				return
			}
			var se *Error
			if !errors.As(err, &se) || se.Field != "payload" || !strings.Contains(se.Rule, tc.rule) {
				t.Fatalf("got %v, want a payload error saying %q", err, tc.rule)
			}
		})
	}
}

// TestAvroZeroWidthItemsCostNothing is the reported case with the default
// limits: a 5-byte payload announcing 2^31-1 nulls. Decoded, it took
// seconds and a GiB; refused by its count, it allocates next to nothing.
func TestAvroZeroWidthItemsCostNothing(t *testing.T) {
	s := mustSchema(t, "avro", "binary", `{"type": "record", "name": "R", "fields": [{"name": "a", "type": {"type": "array", "items": "null"}}]}`, "")
	payload := avroLong(avroLong(nil, 1<<31-1), 0)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	err := s.Validate(payload)
	runtime.ReadMemStats(&after)
	if err == nil || !strings.Contains(err.Error(), "more than 100000 values") {
		t.Fatalf("got %v, want the payload refused for holding more than 100000 values", err)
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > 1<<20 {
		t.Errorf("checking a %d-byte payload allocated %d bytes", len(payload), n)
	}
}

// TestValidateNeverPanics feeds every schema kind random and mutated
// payloads: each is accepted or refused with a *schema.Error, none
// panics (fuzz-style, seeded so a failure repeats).
func TestValidateNeverPanics(t *testing.T) {
	schemas := map[string]*Schema{
		"avro":          mustSchema(t, "avro", "binary", `{"type": "record", "name": "R", "fields": [{"name": "a", "type": {"type": "array", "items": ["null", "string", {"type": "map", "values": "long"}]}}, {"name": "f", "type": {"type": "fixed", "name": "F", "size": 2}}, {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}}, {"name": "d", "type": "double"}]}`, ""),
		"protobuf":      mustSchema(t, "protobuf", "binary", recursiveProto, "shop.v1.Node"),
		"protobuf json": mustSchema(t, "protobuf", "json", recursiveProto, "shop.v1.Node"),
		"jsonschema":    mustSchema(t, "jsonschema", "json", `{"type": "object", "properties": {"a": {"type": "array", "uniqueItems": true}}}`, ""),
	}
	seeds := [][]byte{nil, {0}, avroLong(nil, -3), nestedProto(20), emptyChildren(5), []byte(`{"a": [[{}], "x", 1]}`), []byte(`{"children": [{"next": {}}]}`)}
	rng := rand.New(rand.NewSource(35))
	for name, s := range schemas {
		s := *s
		s.limits = Limits{MaxBytes: 1 << 12, MaxDepth: 16, MaxItems: 5000}
		for i := 0; i < 3000; i++ {
			p := append([]byte(nil), seeds[i%len(seeds)]...)
			for k := rng.Intn(8); k > 0; k-- {
				switch op := rng.Intn(3); {
				case op == 0 || len(p) == 0:
					p = append(p, byte(rng.Intn(256)))
				case op == 1:
					p[rng.Intn(len(p))] = byte(rng.Intn(256))
				default:
					j := rng.Intn(len(p))
					p = append(p[:j:j], append(p[j:j+1:j+1], p[j:]...)...)
				}
			}
			func() {
				defer func() {
					if r := recover(); r != nil {
						t.Fatalf("%s: payload %x panics: %v", name, p, r)
					}
				}()
				var se *Error
				if err := s.Validate(p); err != nil && !errors.As(err, &se) {
					t.Fatalf("%s: payload %x: %v is not a *schema.Error", name, p, err)
				}
			}()
		}
	}
}
