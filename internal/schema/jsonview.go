package schema

import (
	"encoding/json"
	"fmt"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/relaybus/relaybus/shared/topology"
)

// JSONSchema returns the payload's shape as a JSON Schema document, for
// catalogs (internal/catalog) and AsyncAPI: a jsonschema type's own
// document; a protobuf message's JSON mapping (protojson, the payload of
// encoding json) derived from its descriptor; nothing, false, for Avro,
// whose own schema (Definition) is the description. A protobuf message's
// document holds no $ref; a JSON Schema's holds what its author wrote (an
// embedder rebases its local $refs, as internal/catalog does).
func (s *Schema) JSONSchema() (map[string]any, bool) {
	switch v := s.v.(type) {
	case *jsonSchema:
		var doc map[string]any
		if err := json.Unmarshal(s.Definition, &doc); err != nil {
			return nil, false // compiled from the same bytes: unreachable
		}
		return doc, true
	case *protoSchema:
		out := protoJSON(v.desc, map[protoreflect.FullName]bool{})
		out["$comment"] = fmt.Sprintf("protobuf message %s (%s) in protobuf's JSON mapping (protojson): lowerCamelCase names, 64-bit integers as strings, bytes as base64; derived by relaybus", v.desc.FullName(), s.Decl.File)
		return out, true
	}
	return nil, false
}

// PayloadType is the media type of the payloads the schema describes:
// application/json for encoding json, the type's binary media type
// (BinaryMediaType) for encoding binary.
func (s *Schema) PayloadType() string {
	if s.Decl.Encoding == topology.SchemaEncodingBinary {
		return BinaryMediaType(s.Decl.Type)
	}
	return "application/json"
}

// protoJSON describes a message as protojson writes it. A message nested
// in itself (directly or not) is described once; the inner occurrence is
// any object, named in its description, so the document needs no $ref.
func protoJSON(md protoreflect.MessageDescriptor, open map[protoreflect.FullName]bool) map[string]any {
	if open[md.FullName()] {
		return map[string]any{"type": "object", "description": "a " + string(md.FullName()) + " (recursive: described above)"}
	}
	open[md.FullName()] = true
	defer delete(open, md.FullName())
	props := map[string]any{}
	fields := md.Fields()
	for i := range fields.Len() {
		f := fields.Get(i)
		props[f.JSONName()] = protoField(f, open)
	}
	return map[string]any{"title": string(md.FullName()), "type": "object", "properties": props}
}

// protoField describes one field: a map, a list or a single value.
func protoField(f protoreflect.FieldDescriptor, open map[protoreflect.FullName]bool) map[string]any {
	switch {
	case f.IsMap():
		return map[string]any{"type": "object", "additionalProperties": protoValue(f.MapValue(), open)}
	case f.IsList():
		return map[string]any{"type": "array", "items": protoValue(f, open)}
	}
	return protoValue(f, open)
}

// protoValue describes one value of a field's kind in protojson.
func protoValue(f protoreflect.FieldDescriptor, open map[protoreflect.FullName]bool) map[string]any {
	switch f.Kind() {
	case protoreflect.BoolKind:
		return map[string]any{"type": "boolean"}
	case protoreflect.StringKind:
		return map[string]any{"type": "string"}
	case protoreflect.BytesKind:
		return map[string]any{"type": "string", "contentEncoding": "base64"}
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return map[string]any{"type": "integer", "format": "int32"}
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return map[string]any{"type": "integer", "format": "uint32", "minimum": 0}
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return map[string]any{"type": []any{"string", "integer"}, "format": "int64", "description": "a 64-bit integer: protojson writes a string of digits and reads either"}
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return map[string]any{"type": []any{"string", "integer"}, "format": "uint64", "description": "a 64-bit integer: protojson writes a string of digits and reads either"}
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		return map[string]any{"type": []any{"number", "string"}, "description": "a number, or \"NaN\", \"Infinity\", \"-Infinity\""}
	case protoreflect.EnumKind:
		vals := f.Enum().Values()
		names := make([]any, 0, vals.Len())
		for i := range vals.Len() {
			names = append(names, string(vals.Get(i).Name()))
		}
		return map[string]any{"title": string(f.Enum().FullName()), "type": "string", "enum": names}
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return protoJSON(f.Message(), open)
	}
	return map[string]any{}
}
