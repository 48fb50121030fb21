// Package schema compiles the payload schemas a topology declares (a
// protobuf message, an Avro record or a JSON Schema per topic and
// schemaVersion, infra/topology.yaml) and checks payloads against them.
//
// Every send path (functions/publish, outbox.Enqueue through a
// [outbox.Contract], a handler's Emit) calls [Set.Check] before it writes,
// so Pub/Sub, which validates the message data of a topic with a schema
// (https://cloud.google.com/pubsub/docs/schemas), never refuses what the
// relay holds. [Compare] says whether a schema change is one relaybus allows
// (docs/schemas.md "Compatibility": add optional fields, never remove, retype,
// renumber or make required); `relaybus schemas check` runs it before a
// deploy.
//
// Libraries, each the maintained reference for its format in Go:
// github.com/bufbuild/protocompile compiles .proto files at run time (the
// compiler behind buf), google.golang.org/protobuf's dynamicpb and protojson
// decode against the compiled descriptor; github.com/hamba/avro/v2 parses and
// decodes Avro and checks reader/writer compatibility;
// github.com/santhosh-tekuri/jsonschema/v6 compiles and validates JSON Schema
// (drafts 4 to 2020-12).
package schema

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/topology"
)

// Error reports a payload (or its schemaVersion or payloadType) that breaks
// its topic's schema. It unwraps to an *event.FieldError with the same
// field and rule, so errors.Is(err, event.ErrInvalid) holds and the HTTP
// publish answers it 400 as any other field error.
type Error struct {
	// Topic and Version name the schema.
	Topic, Version string
	// Field is where the problem is: "payload" or a path inside it
	// ("payload.items[0].sku", "payload/items/0/sku" for JSON Schema), or
	// "schemaVersion" or "payloadType".
	Field string
	// Rule says what the field must be.
	Rule string
}

// Error returns "field: rule (topic T, schema V)".
func (e *Error) Error() string {
	return fmt.Sprintf("%s: %s (topic %s, schema %s)", e.Field, e.Rule, e.Topic, e.Version)
}

// Unwrap returns the equivalent *event.FieldError.
func (e *Error) Unwrap() error {
	return &event.FieldError{Field: e.Field, Rule: e.Rule + " (topic " + e.Topic + ", schema " + e.Version + ")"}
}

// Schema is one compiled schema: the payload schema of one schemaVersion of
// one topic.
type Schema struct {
	// Topic is the topic the schema belongs to.
	Topic string
	// Decl is the topology's declaration.
	Decl topology.Schema
	// Definition is the schema file's text (what Pub/Sub takes as a
	// schema's definition).
	Definition []byte

	v      validator
	limits Limits
}

// validator checks a payload; it returns the field and rule of the first
// problem, or ok. shape walks the payload against l before anything
// decodes it (budget.go).
type validator interface {
	shape(payload []byte, binary bool, l Limits) error
	validate(payload []byte, binary bool) (field, rule string, ok bool)
}

// Validate checks a payload against the schema, within DefaultLimits: a
// payload past them is refused, naming the limit, before it is decoded.
func (s *Schema) Validate(payload []byte) error {
	binary := s.Decl.Encoding == topology.SchemaEncodingBinary
	if err := s.v.shape(payload, binary, s.limits.orDefault()); err != nil {
		return &Error{Topic: s.Topic, Version: s.Decl.Version, Field: "payload", Rule: err.Error()}
	}
	field, rule, ok := s.v.validate(payload, binary)
	if ok {
		return nil
	}
	return &Error{Topic: s.Topic, Version: s.Decl.Version, Field: field, Rule: rule}
}

// Set is every schema of a topology, compiled.
type Set struct {
	topics map[string]map[string]*Schema
}

// Source reads a schema file by its path relative to the topology file's
// directory.
type Source func(name string) ([]byte, error)

// DirSource reads schema files under dir.
func DirSource(dir string) Source {
	return func(name string) ([]byte, error) { return os.ReadFile(filepath.Join(dir, filepath.FromSlash(name))) }
}

// Load compiles every schema top declares, reading the files under the
// topology file's directory (top.Dir). It fails, naming the topic, version
// and file, on a file that is missing or does not compile.
func Load(top *topology.Topology) (*Set, error) {
	return LoadFrom(top, DirSource(top.Dir))
}

// LoadFrom is Load reading the files through read.
func LoadFrom(top *topology.Topology, read Source) (*Set, error) {
	set := &Set{topics: map[string]map[string]*Schema{}}
	var errs []error
	for i, tp := range top.Topics {
		for k, d := range tp.Schemas {
			where := fmt.Sprintf("topics[%d] (%s).schemas[%d] (%s)", i, tp.Name, k, d.Version)
			def, err := read(d.File)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s.file: %w", where, err))
				continue
			}
			s := &Schema{Topic: tp.Name, Decl: d, Definition: def, limits: DefaultLimits}
			switch d.Type {
			case topology.SchemaProtobuf:
				s.v, err = compileProto(d.File, def, d.Message)
			case topology.SchemaAvro:
				s.v, err = compileAvro(def)
			case topology.SchemaJSON:
				s.v, err = compileJSONSchema(d.File, def)
			default:
				err = fmt.Errorf("unknown type %q", d.Type)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %s: %w", where, d.File, err))
				continue
			}
			if set.topics[tp.Name] == nil {
				set.topics[tp.Name] = map[string]*Schema{}
			}
			set.topics[tp.Name][d.Version] = s
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("schemas: %w", err)
	}
	return set, nil
}

// For returns the schema of a topic's version, or false.
func (s *Set) For(topic, version string) (*Schema, bool) {
	if s == nil {
		return nil, false
	}
	sc, ok := s.topics[topic][version]
	return sc, ok
}

// Versions returns the versions a topic declares, sorted by number.
func (s *Set) Versions(topic string) []string {
	if s == nil {
		return nil
	}
	var out []string
	for v := range s.topics[topic] {
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool { return versionLess(out[i], out[j]) })
	return out
}

// versionLess orders v2 before v10.
func versionLess(a, b string) bool {
	if len(a) != len(b) {
		return len(a) < len(b)
	}
	return a < b
}

// Check validates e's payload against its topic's schema for e's
// schemaVersion (an empty one is event.DefaultSchemaVersion). A topic that
// declares no schema takes any payload. It returns an *Error for an
// undeclared version, a payload type that is not the schema's encoding, or
// a payload that breaks the schema.
func (s *Set) Check(e *event.Event) error {
	if s == nil || len(s.topics[e.Topic]) == 0 {
		return nil
	}
	v := e.SchemaVersion
	if v == "" {
		v = event.DefaultSchemaVersion
	}
	sc, ok := s.topics[e.Topic][v]
	if !ok {
		return &Error{Topic: e.Topic, Version: v, Field: "schemaVersion",
			Rule: fmt.Sprintf("must be a version topic %s declares a schema for in infra/topology.yaml (%s)", e.Topic, strings.Join(s.Versions(e.Topic), ", "))}
	}
	pt := e.PayloadType
	if pt == "" {
		pt = event.DefaultPayloadType
	}
	switch binary := sc.Decl.Encoding == topology.SchemaEncodingBinary; {
	case !binary && !event.IsJSONType(pt):
		return &Error{Topic: e.Topic, Version: v, Field: "payloadType",
			Rule: fmt.Sprintf("must be a JSON media type (application/json): the topic's %s schema takes encoding json, not %q", sc.Decl.Type, pt)}
	case binary && event.IsJSONType(pt):
		return &Error{Topic: e.Topic, Version: v, Field: "payloadType",
			Rule: fmt.Sprintf("must be the %s binary encoding's media type (%s): the topic's schema takes encoding binary, not %q", sc.Decl.Type, BinaryMediaType(sc.Decl.Type), pt)}
	}
	return sc.Validate(e.Payload)
}

// BinaryMediaType is the payload type of a schema type's binary encoding:
// application/protobuf or application/avro (the registered types,
// https://www.iana.org/assignments/media-types). Check accepts any media
// type that is not JSON for a binary schema.
func BinaryMediaType(typ string) string {
	switch typ {
	case topology.SchemaProtobuf:
		return "application/protobuf"
	case topology.SchemaAvro:
		return "application/avro"
	}
	return "application/octet-stream"
}
