package schema

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/hamba/avro/v2"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/relaybus/relaybus/shared/topology"
)

// Change kinds Compare reports: the changes relaybus forbids within a
// schema version (docs/schemas.md "Compatibility": add optional fields,
// enum values and messages; never delete a field or change its type or
// number).
const (
	// ChangeRemoved: a field (protobuf, Avro, a JSON Schema property) or an
	// enum value is gone.
	ChangeRemoved = "removed"
	// ChangeType: a field's type (or its cardinality: repeated, map) changed.
	ChangeType = "type changed"
	// ChangeNumber: a protobuf field kept its name under another number.
	ChangeNumber = "renumbered"
	// ChangeRenamed: a protobuf field kept its number under another name,
	// which breaks the JSON encoding (binary payloads do not name fields).
	ChangeRenamed = "renamed"
	// ChangeRequired: an optional field became required, or a new field is
	// required.
	ChangeRequired = "made required"
	// ChangeIncompatible: Avro's resolution rules refuse the pair (hamba/avro's
	// checker); Detail says why.
	ChangeIncompatible = "incompatible"
	// ChangeFormat: the schema's type or encoding changed.
	ChangeFormat = "format changed"
)

// Change is one forbidden difference between two schemas.
type Change struct {
	// Field is the field's path: Message.field.sub for protobuf, the record
	// path for Avro, a JSON pointer under the root for JSON Schema.
	Field string
	// Kind is one of the Change* constants.
	Kind string
	// Detail says what changed, old and new.
	Detail string
}

// String returns "field: kind: detail".
func (c Change) String() string {
	if c.Field == "" {
		return c.Kind + ": " + c.Detail
	}
	return c.Field + ": " + c.Kind + ": " + c.Detail
}

// Compare returns the changes from old to new that relaybus forbids, so
// that a consumer reading either can read what a producer of the other
// writes; none means the change is allowed. Protobuf and JSON Schema are
// compared on their descriptors and schema trees by relaybus's own rules
// (no maintained Go library checks their compatibility); Avro by
// hamba/avro's SchemaCompatibility in both directions, plus the removed
// fields it lets pass when they had a default.
func Compare(old, new *Schema) []Change {
	if old.Decl.Type != new.Decl.Type || old.Decl.Encoding != new.Decl.Encoding {
		return []Change{{Kind: ChangeFormat, Detail: fmt.Sprintf("%s/%s became %s/%s", old.Decl.Type, old.Decl.Encoding, new.Decl.Type, new.Decl.Encoding)}}
	}
	var out []Change
	switch o := old.v.(type) {
	case *protoSchema:
		pc := &protoCompare{json: new.Decl.Encoding == topology.SchemaEncodingJSON, seen: map[[2]protoreflect.FullName]bool{}}
		pc.message(o.desc, new.v.(*protoSchema).desc, string(o.desc.Name()))
		out = pc.out
	case *avroSchema:
		out = compareAvro(o.s, new.v.(*avroSchema).s)
	case *jsonSchema:
		var a, b any
		_ = json.Unmarshal(old.Definition, &a)
		_ = json.Unmarshal(new.Definition, &b)
		out = compareJSONSchema(a, b, "")
	}
	return out
}

type protoCompare struct {
	json bool
	seen map[[2]protoreflect.FullName]bool
	out  []Change
}

func (p *protoCompare) add(field, kind, format string, args ...any) {
	p.out = append(p.out, Change{Field: field, Kind: kind, Detail: fmt.Sprintf(format, args...)})
}

// message compares two message descriptors field by field, by number.
func (p *protoCompare) message(o, n protoreflect.MessageDescriptor, path string) {
	key := [2]protoreflect.FullName{o.FullName(), n.FullName()}
	if p.seen[key] {
		return
	}
	p.seen[key] = true
	of, nf := o.Fields(), n.Fields()
	for i := 0; i < of.Len(); i++ {
		f := of.Get(i)
		fp := path + "." + string(f.Name())
		g := nf.ByNumber(f.Number())
		if g == nil {
			if byName := nf.ByName(f.Name()); byName != nil {
				p.add(fp, ChangeNumber, "number %d became %d", f.Number(), byName.Number())
			} else {
				p.add(fp, ChangeRemoved, "field %d (%s) is gone; mark it reserved only once no producer or consumer uses it", f.Number(), typeName(f))
			}
			continue
		}
		if g.Name() != f.Name() && p.json {
			p.add(fp, ChangeRenamed, "field %d is now %q; the JSON encoding names fields", f.Number(), g.Name())
		}
		// Same kind and shape: a scalar kept its type; a message or enum
		// field is compared structurally below (its type may be renamed).
		sameShape := f.IsMap() == g.IsMap() && f.IsList() == g.IsList()
		if f.Kind() != g.Kind() || !sameShape {
			p.add(fp, ChangeType, "%s became %s", typeName(f), typeName(g))
			continue
		}
		if f.Cardinality() != protoreflect.Required && g.Cardinality() == protoreflect.Required {
			p.add(fp, ChangeRequired, "an optional field is now required")
		}
		switch {
		case f.IsMap():
			if f.MapValue().Message() != nil && g.MapValue().Message() != nil {
				p.message(f.MapValue().Message(), g.MapValue().Message(), fp)
			} else if typeName(f.MapValue()) != typeName(g.MapValue()) {
				p.add(fp, ChangeType, "%s became %s", typeName(f), typeName(g))
			}
		case f.Message() != nil:
			p.message(f.Message(), g.Message(), fp)
		case f.Enum() != nil:
			ov, nv := f.Enum().Values(), g.Enum().Values()
			for k := 0; k < ov.Len(); k++ {
				if v := ov.Get(k); nv.ByNumber(v.Number()) == nil {
					p.add(fp, ChangeRemoved, "enum value %s (%d) is gone", v.Name(), v.Number())
				}
			}
		}
	}
	for i := 0; i < nf.Len(); i++ {
		g := nf.Get(i)
		if of.ByNumber(g.Number()) == nil && g.Cardinality() == protoreflect.Required {
			p.add(path+"."+string(g.Name()), ChangeRequired, "a new field is required; a new field must be optional")
		}
	}
}

// typeName describes a field's type: "string", "repeated int64",
// "map<string, pkg.Item>", "pkg.Item".
func typeName(f protoreflect.FieldDescriptor) string {
	var t string
	switch {
	case f.IsMap():
		return "map<" + typeName(f.MapKey()) + ", " + typeName(f.MapValue()) + ">"
	case f.Message() != nil:
		t = string(f.Message().FullName())
	case f.Enum() != nil:
		t = string(f.Enum().FullName())
	default:
		t = f.Kind().String()
	}
	if f.Cardinality() == protoreflect.Repeated {
		return "repeated " + t
	}
	return t
}

// compareAvro checks both directions with hamba/avro (a consumer on the
// new schema reads old data, one on the old schema reads new data) and
// lists the record fields that are gone.
func compareAvro(o, n avro.Schema) []Change {
	var out []Change
	sc := avro.NewSchemaCompatibility()
	if err := sc.Compatible(n, o); err != nil {
		out = append(out, Change{Kind: ChangeIncompatible, Detail: "a consumer on the new schema cannot read data written with the old one: " + err.Error()})
	}
	if err := sc.Compatible(o, n); err != nil {
		out = append(out, Change{Kind: ChangeIncompatible, Detail: "a consumer on the old schema cannot read data written with the new one: " + err.Error()})
	}
	removedAvroFields(o, n, avroName(o), map[string]bool{}, &out)
	return out
}

func removedAvroFields(o, n avro.Schema, path string, seen map[string]bool, out *[]Change) {
	or, ok1 := o.(*avro.RecordSchema)
	nr, ok2 := n.(*avro.RecordSchema)
	if !ok1 || !ok2 || seen[or.FullName()] {
		return
	}
	seen[or.FullName()] = true
	for _, f := range or.Fields() {
		var g *avro.Field
		for _, c := range nr.Fields() {
			if c.Name() == f.Name() || slices.Contains(c.Aliases(), f.Name()) {
				g = c
				break
			}
		}
		fp := path + "." + f.Name()
		if g == nil {
			*out = append(*out, Change{Field: fp, Kind: ChangeRemoved, Detail: "field " + f.Name() + " (" + string(f.Type().Type()) + ") is gone"})
			continue
		}
		removedAvroFields(f.Type(), g.Type(), fp, seen, out)
	}
}

// compareJSONSchema walks two JSON Schema trees: a property that is gone, a
// type that changed, a property newly required; into properties and items.
func compareJSONSchema(o, n any, path string) []Change {
	om, _ := o.(map[string]any)
	nm, _ := n.(map[string]any)
	if om == nil || nm == nil {
		return nil
	}
	at := path
	if at == "" {
		at = "/"
	}
	var out []Change
	if ot, nt := jsonTypes(om), jsonTypes(nm); ot != nil && !slices.Equal(ot, nt) {
		out = append(out, Change{Field: at, Kind: ChangeType, Detail: fmt.Sprintf("type %s became %s", jsonTypeString(ot), jsonTypeString(nt))})
	}
	op, _ := om["properties"].(map[string]any)
	np, _ := nm["properties"].(map[string]any)
	oreq, nreq := jsonRequired(om), jsonRequired(nm)
	names := make([]string, 0, len(op))
	for name := range op {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		fp := path + "/" + name
		ns, ok := np[name]
		if !ok {
			out = append(out, Change{Field: fp, Kind: ChangeRemoved, Detail: "property " + name + " is gone"})
			continue
		}
		if nreq[name] && !oreq[name] {
			out = append(out, Change{Field: fp, Kind: ChangeRequired, Detail: "an optional property is now required"})
		}
		out = append(out, compareJSONSchema(op[name], ns, fp)...)
	}
	var added []string
	for name := range nreq {
		if _, existed := op[name]; !existed && !oreq[name] {
			added = append(added, name)
		}
	}
	sort.Strings(added)
	for _, name := range added {
		out = append(out, Change{Field: path + "/" + name, Kind: ChangeRequired, Detail: "a new property is required; a new property must be optional"})
	}
	if oi, ok := om["items"]; ok {
		out = append(out, compareJSONSchema(oi, nm["items"], path+"/items")...)
	}
	return out
}

// jsonTypes returns a schema's type keyword as a sorted list (nil when absent).
func jsonTypes(m map[string]any) []string {
	switch t := m["type"].(type) {
	case string:
		return []string{t}
	case []any:
		var out []string
		for _, v := range t {
			if s, ok := v.(string); ok {
				out = append(out, s)
			}
		}
		sort.Strings(out)
		return out
	}
	return nil
}

func jsonTypeString(t []string) string {
	if t == nil {
		return "(any)"
	}
	return strings.Join(t, "|")
}

func jsonRequired(m map[string]any) map[string]bool {
	out := map[string]bool{}
	if r, ok := m["required"].([]any); ok {
		for _, v := range r {
			if s, ok := v.(string); ok {
				out[s] = true
			}
		}
	}
	return out
}

// Finding is one forbidden change of a topic version's schema between a
// base (the previous commit, the deployed files) and the head.
type Finding struct {
	// Topic and Version name the schema.
	Topic, Version string
	// Change is what changed.
	Change Change
}

// String returns "topic version: field: kind: detail".
func (f Finding) String() string { return f.Topic + " " + f.Version + ": " + f.Change.String() }

// Evolution compares the head's schemas with the base's: each version
// both declare must have changed compatibly (Compare). A version new in the
// head is not compared with the older ones: a new schemaVersion is how a
// breaking change is made, its producers publishing both versions until
// every consumer reads the new one (docs/schemas.md "Breaking changes: a
// new schema version"); a version
// the head no longer declares is retired. It returns the findings and the
// number of versions compared.
func Evolution(base, head *Set) ([]Finding, int) {
	var out []Finding
	n := 0
	topics := make([]string, 0, len(head.topics))
	for t := range head.topics {
		topics = append(topics, t)
	}
	sort.Strings(topics)
	for _, t := range topics {
		for _, v := range head.Versions(t) {
			old, ok := base.For(t, v)
			if !ok {
				continue
			}
			n++
			for _, c := range Compare(old, head.topics[t][v]) {
				out = append(out, Finding{Topic: t, Version: v, Change: c})
			}
		}
	}
	return out, n
}
