package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/relaybus/relaybus/internal/inbox"
	"github.com/relaybus/relaybus/shared/event"
)

// Register registers f on m for eventType and schemaVersion, with the
// payload decoded into a T (Decode): a thin typed layer over the Mux, as
// Watermill's cqrs handlers are over its router. Register one T per
// schema version of a type to read them side by side:
//
//	consumer.Register(mux, "order.purchased", "v1", func(ctx context.Context, c *consumer.Context, o OrderV1) error { ... })
//	consumer.Register(mux, "order.purchased", "v2", func(ctx context.Context, c *consumer.Context, o *orderpb.PurchasedV2) error { ... })
//
// A payload that does not decode fails the attempt as poison
// ("bad_payload", dead-lettered with a *PayloadError naming the field)
// without calling f; a version nothing is registered for is poison
// ("no_handler", the message naming the versions the consumer reads); see
// Mux.Handle for a change published in several versions.
func Register[T any](m *Mux, eventType, schemaVersion string, f func(ctx context.Context, c *Context, v T) error) {
	m.Register(eventType, schemaVersion, HandlerFunc(func(ctx context.Context, c *Context) error {
		v, err := Decode[T](c.Event)
		if err != nil {
			return err
		}
		return f(ctx, c, v)
	}))
}

// PayloadError is a payload that cannot be decoded into the type its
// handler declared. Decode returns it wrapped as poison ("bad_payload").
type PayloadError struct {
	// EventType and SchemaVersion are the event's.
	EventType, SchemaVersion string
	// Field is the payload's field that broke the rule ("payload.amount"),
	// or "payload" for the payload as a whole.
	Field string
	// Rule says what the field must be.
	Rule string
	// Err is the decoder's own error.
	Err error
}

// Error names the event type, the schema version, the field and the rule.
func (e *PayloadError) Error() string {
	return fmt.Sprintf("%s %s: %s: %s", e.EventType, e.SchemaVersion, e.Field, e.Rule)
}

// Unwrap returns the decoder's error.
func (e *PayloadError) Unwrap() error { return e.Err }

// Decode decodes e's payload into a T. A T that is a protobuf message (a
// generated *pb.Message type) is read with proto.Unmarshal, or with
// protojson when the payload type is JSON; any other T is read from JSON
// with encoding/json. Fields the T does not know are ignored (a reader of
// v1 reads a payload a newer producer added optional fields to, as the
// compatibility rules allow: docs/schemas.md). A failure is poison ("bad_payload")
// wrapping a *PayloadError.
func Decode[T any](e *event.Event) (T, error) {
	var v T
	fail := func(field, rule string, err error) (T, error) {
		var zero T
		return zero, Poison("bad_payload", &PayloadError{EventType: e.Type, SchemaVersion: e.SchemaVersion, Field: field, Rule: rule, Err: err})
	}
	if pm, ok := any(v).(proto.Message); ok {
		m := pm.ProtoReflect().Type().New().Interface()
		name := string(m.ProtoReflect().Descriptor().FullName())
		if event.IsJSONType(e.PayloadType) {
			if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(e.Payload, m); err != nil {
				return fail("payload", "must be "+name+" in protobuf's JSON mapping ("+protoDetail(err)+")", err)
			}
		} else if err := proto.Unmarshal(e.Payload, m); err != nil {
			return fail("payload", "must be "+name+" in protobuf's binary encoding ("+protoDetail(err)+")", err)
		}
		return m.(T), nil
	}
	if !event.IsJSONType(e.PayloadType) {
		return fail("payloadType", fmt.Sprintf("must be JSON to decode into %T (got %q)", v, e.PayloadType), nil)
	}
	if err := json.Unmarshal(e.Payload, &v); err != nil {
		var te *json.UnmarshalTypeError
		var se *json.SyntaxError
		switch {
		case errors.As(err, &te):
			field := "payload"
			if te.Field != "" {
				field += "." + te.Field
			}
			return fail(field, fmt.Sprintf("must be a JSON value that fits %s (got a JSON %s)", te.Type, te.Value), err)
		case errors.As(err, &se):
			return fail("payload", fmt.Sprintf("must be valid JSON (error at byte %d: %v)", se.Offset, err), err)
		}
		return fail("payload", fmt.Sprintf("must decode into %T: %v", v, err), err)
	}
	return v, nil
}

// protoDetail is a protobuf error without its "proto: " prefix.
func protoDetail(err error) string {
	s := err.Error()
	s = strings.TrimPrefix(s, "proto:")
	s = strings.TrimPrefix(s, "proto: ")
	return strings.TrimSpace(strings.ReplaceAll(s, "\u00a0", " "))
}

// versions returns the schema versions registered for eventType (not
// Any), sorted.
func (m *Mux) versions(eventType string) []string {
	var vs []string
	for k := range m.routes {
		if k[0] == eventType && k[1] != Any {
			vs = append(vs, k[1])
		}
	}
	slices.Sort(vs)
	return vs
}

// sideBySide decides, for an event of a change published in several
// schema versions (event.SideBySide: newest version first, on consecutive
// aggregate versions), whether the mux skips it (acknowledged, no effect,
// the attempt recorded a success):
//
//   - the consumer has applied another version of the change that this
//     mux has a route for (eventType + that version; inbox.Applied, so a
//     version a strict consumer parked does not count): the change is
//     applied;
//   - no route takes the event's version and it is newer than every
//     version registered for its type: an older one of the change, which
//     the consumer reads, follows.
//
// Otherwise the event is routed as any other. A route for Any version
// gets every version of a change and tells them apart itself. The inbox
// is read in c.Tx; with no transaction (a Remote handler) nothing is
// skipped.
func (m *Mux) sideBySide(ctx context.Context, c *Context) (bool, error) {
	change, ok := event.ChangeOf(c.Event)
	if !ok || c.Tx == nil {
		return false, nil
	}
	vs := m.versions(c.Event.Type)
	var siblings []string
	for _, v := range vs {
		if v != c.Event.SchemaVersion {
			siblings = append(siblings, change+"."+v)
		}
	}
	if len(siblings) > 0 {
		applied, err := inbox.Applied(ctx, c.Tx, c.ConsumerID, siblings...)
		if err != nil {
			return false, Transient("database", err)
		}
		if len(applied) > 0 {
			return true, nil
		}
	}
	if len(vs) == 0 || slices.Contains(vs, c.Event.SchemaVersion) {
		return false, nil
	}
	if _, ok := m.routes[[2]string{c.Event.Type, Any}]; ok {
		return false, nil
	}
	n := event.SchemaNumber(c.Event.SchemaVersion)
	for _, v := range vs {
		if event.SchemaNumber(v) >= n {
			return false, nil
		}
	}
	return true, nil
}
