package schema

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/bufbuild/protocompile"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
)

// protoSchema validates payloads as one protobuf message.
type protoSchema struct {
	desc protoreflect.MessageDescriptor
}

// compileProto compiles one self-contained .proto file and finds message in
// it. Imports are refused: Pub/Sub takes a single file's text as a
// PROTOCOL_BUFFER schema definition.
func compileProto(name string, def []byte, message string) (*protoSchema, error) {
	desc, err := protoMessage(name, def, message)
	if err != nil {
		return nil, err
	}
	return &protoSchema{desc: desc}, nil
}

// protoMessage compiles def and returns the named message's descriptor.
func protoMessage(name string, def []byte, message string) (protoreflect.MessageDescriptor, error) {
	c := protocompile.Compiler{
		Resolver: &protocompile.SourceResolver{
			Accessor: func(path string) (io.ReadCloser, error) {
				if path != name {
					return nil, fmt.Errorf("imports %s: a Pub/Sub protobuf schema is one self-contained file (declare the types it needs in it)", path)
				}
				return io.NopCloser(bytes.NewReader(def)), nil
			},
		},
	}
	files, err := c.Compile(context.Background(), name)
	if err != nil {
		return nil, fmt.Errorf("does not compile: %w", err)
	}
	fd := files[0]
	if fd.Imports().Len() > 0 {
		return nil, fmt.Errorf("imports %s: a Pub/Sub protobuf schema is one self-contained file (declare the types it needs in it)", fd.Imports().Get(0).Path())
	}
	// Pub/Sub takes one message as a PROTOCOL_BUFFER schema, the types it
	// uses nested in it: the form the Pub/Sub schema generators produce
	// (buf's protoschema-plugins: "a single self-contained message";
	// alpancs/protoc-gen-pubsub-schema: "a single valid message").
	if n, e := fd.Messages().Len(), fd.Enums().Len(); n != 1 || e != 0 || fd.Messages().Get(0).FullName() != protoreflect.FullName(message) {
		return nil, fmt.Errorf("declares %d top-level message(s) and %d top-level enum(s): a Pub/Sub protobuf schema is one top-level message, %s, with the types it uses nested in it", n, e, message)
	}
	d := fd.FindDescriptorByName(protoreflect.FullName(message))
	md, ok := d.(protoreflect.MessageDescriptor)
	if !ok {
		return nil, fmt.Errorf("declares no message %q (package %q)", message, fd.Package())
	}
	return md, nil
}

func (p *protoSchema) shape(payload []byte, binary bool, l Limits) error {
	if binary {
		return walkProto(payload, p.desc, l)
	}
	return walkJSON(payload, l)
}

func (p *protoSchema) validate(payload []byte, binary bool) (string, string, bool) {
	m := dynamicpb.NewMessage(p.desc)
	if !binary {
		if err := protojson.Unmarshal(payload, m); err != nil {
			return "payload", "must be " + string(p.desc.FullName()) + " in protobuf's JSON mapping: " + strings.TrimPrefix(err.Error(), "proto: "), false
		}
		return "", "", true
	}
	if err := proto.Unmarshal(payload, m); err != nil {
		return "payload", "must be " + string(p.desc.FullName()) + " in protobuf's binary encoding: " + strings.TrimPrefix(err.Error(), "proto: "), false
	}
	if path, rule, found := unknownField(m.ProtoReflect(), "payload"); found {
		return path, rule, false
	}
	return "", "", true
}

// unknownField finds the first field a decoded message holds that its
// descriptor does not declare (or declares with another wire type, which
// protobuf keeps as unknown), and returns its path and the rule it breaks.
func unknownField(m protoreflect.Message, path string) (string, string, bool) {
	if raw := m.GetUnknown(); len(raw) > 0 {
		num, typ, _ := protowire.ConsumeTag(raw)
		md := m.Descriptor()
		if fd := md.Fields().ByNumber(num); fd != nil {
			return path + "." + string(fd.Name()), fmt.Sprintf("field %d is %s in %s, but the payload has it with wire type %d", num, typeName(fd), md.FullName(), typ), true
		}
		return path, fmt.Sprintf("has field number %d, which %s does not declare (a payload is checked against its own schemaVersion)", num, md.FullName()), true
	}
	var (
		outPath string
		outRule string
		found   bool
	)
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Message() == nil || fd.IsMap() && fd.MapValue().Message() == nil {
			return true
		}
		p := path + "." + string(fd.Name())
		switch {
		case fd.IsList():
			l := v.List()
			for i := 0; i < l.Len() && !found; i++ {
				outPath, outRule, found = unknownField(l.Get(i).Message(), fmt.Sprintf("%s[%d]", p, i))
			}
		case fd.IsMap():
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				outPath, outRule, found = unknownField(mv.Message(), fmt.Sprintf("%s[%v]", p, k.Interface()))
				return !found
			})
		default:
			outPath, outRule, found = unknownField(v.Message(), p)
		}
		return !found
	})
	return outPath, outRule, found
}
