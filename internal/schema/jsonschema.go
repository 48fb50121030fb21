package schema

import (
	"bytes"
	"errors"
	"fmt"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// jsonSchema validates JSON payloads against a compiled JSON Schema.
type jsonSchema struct {
	s *jsonschema.Schema
}

var english = message.NewPrinter(language.English)

// compileJSONSchema compiles a JSON Schema document. It is compiled alone:
// a $ref to another file is not loaded.
func compileJSONSchema(name string, def []byte) (*jsonSchema, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(def))
	if err != nil {
		return nil, fmt.Errorf("is not JSON: %w", err)
	}
	url := "relaybus:///" + strings.TrimPrefix(name, "/")
	c := jsonschema.NewCompiler()
	if err := c.AddResource(url, doc); err != nil {
		return nil, err
	}
	s, err := c.Compile(url)
	if err != nil {
		return nil, fmt.Errorf("is not a valid JSON Schema: %w", err)
	}
	return &jsonSchema{s: s}, nil
}

func (j *jsonSchema) shape(payload []byte, _ bool, l Limits) error {
	return walkJSON(payload, l)
}

func (j *jsonSchema) validate(payload []byte, _ bool) (string, string, bool) {
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(payload))
	if err != nil {
		return "payload", "must be JSON: " + err.Error(), false
	}
	err = j.s.Validate(inst)
	if err == nil {
		return "", "", true
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return "payload", err.Error(), false
	}
	for len(ve.Causes) > 0 {
		ve = ve.Causes[0]
	}
	field := "payload"
	for _, seg := range ve.InstanceLocation {
		field += "/" + seg
	}
	return field, ve.ErrorKind.LocalizedString(english), false
}
