package schema

import (
	"fmt"

	"github.com/hamba/avro/v2"
)

// avroSchema validates payloads as Avro binary data of one schema.
type avroSchema struct {
	s avro.Schema
}

// compileAvro parses an Avro schema. Each call parses into its own cache,
// so two topics (or a base and a head in Compare) may declare records of
// the same name.
func compileAvro(def []byte) (*avroSchema, error) {
	s, err := avro.ParseBytesWithCache(def, "", &avro.SchemaCache{})
	if err != nil {
		return nil, fmt.Errorf("is not an Avro schema: %w", err)
	}
	return &avroSchema{s: s}, nil
}

func (a *avroSchema) shape(payload []byte, _ bool, l Limits) error {
	return walkAvro(payload, a.s, l)
}

func (a *avroSchema) validate(payload []byte, binary bool) (string, string, bool) {
	if !binary {
		// topology refuses avro with encoding json; never reached.
		return "payloadType", "an Avro schema takes encoding binary", false
	}
	var v any
	if err := avro.Unmarshal(a.s, payload, &v); err != nil {
		return "payload", "must be " + avroName(a.s) + " in Avro's binary encoding: " + err.Error(), false
	}
	// Avro binary is not self-delimiting: data written with another schema
	// can decode as a prefix. Writing the value back must give every byte.
	b, err := avro.Marshal(a.s, v)
	if err != nil || len(b) != len(payload) {
		return "payload", fmt.Sprintf("must be exactly one %s in Avro's binary encoding: %d bytes decode as one, the payload has %d", avroName(a.s), len(b), len(payload)), false
	}
	return "", "", true
}

func avroName(s avro.Schema) string {
	if n, ok := s.(avro.NamedSchema); ok {
		return n.FullName()
	}
	return string(s.Type())
}
