package event

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// envelope is the plain JSON form of an event, with relaybus's field names.
type envelope struct {
	EventID       string          `json:"eventId,omitempty"`
	EventType     string          `json:"eventType,omitempty"`
	Source        string          `json:"source,omitempty"`
	Topic         string          `json:"topic,omitempty"`
	AggregateType string          `json:"aggregateType,omitempty"`
	AggregateID   string          `json:"aggregateId,omitempty"`
	Version       json.RawMessage `json:"version,omitempty"`
	OccurredAt    string          `json:"occurredAt,omitempty"`
	SchemaVersion string          `json:"schemaVersion,omitempty"`
	PayloadType   string          `json:"payloadType,omitempty"`
	Payload       json.RawMessage `json:"payload,omitempty"`
	TraceID       string          `json:"traceId,omitempty"`
	SpanID        string          `json:"spanId,omitempty"`
	ParentEventID string          `json:"parentEventId,omitempty"`
	CausationID   string          `json:"causationId,omitempty"`
	CorrelationID string          `json:"correlationId,omitempty"`
	SourceVersion string          `json:"sourceVersion,omitempty"`
	Initiator     *Initiator      `json:"initiator,omitempty"`
	ExpireAt      string          `json:"expireAt,omitempty"`
	DeliverAt     string          `json:"deliverAt,omitempty"`
}

// MarshalJSON writes the plain JSON envelope: relaybus's field names
// (eventId, eventType, topic, aggregateType, aggregateId, version, occurredAt,
// schemaVersion, payloadType, payload, traceId, spanId, parentEventId,
// correlationId, initiator, expireAt, deliverAt) plus source. A JSON payload is inlined;
// any other payload is a base64 string.
func (e Event) MarshalJSON() ([]byte, error) {
	env := envelope{
		EventID: e.ID, EventType: e.Type, Source: e.Source, Topic: e.Topic,
		AggregateType: e.AggregateType, AggregateID: e.AggregateID,
		SchemaVersion: e.SchemaVersion, PayloadType: e.PayloadType,
		TraceID: e.TraceID, SpanID: e.SpanID, ParentEventID: e.ParentEventID,
		CorrelationID: e.CorrelationID,
		SourceVersion: e.SourceVersion,
	}
	if e.Version != 0 {
		env.Version = json.RawMessage(strconv.FormatInt(e.Version, 10))
	}
	if !e.OccurredAt.IsZero() {
		env.OccurredAt = e.OccurredAt.UTC().Format(time.RFC3339Nano)
	}
	if !e.ExpireAt.IsZero() {
		env.ExpireAt = e.ExpireAt.UTC().Format(time.RFC3339Nano)
	}
	if !e.DeliverAt.IsZero() {
		env.DeliverAt = e.DeliverAt.UTC().Format(time.RFC3339Nano)
	}
	if e.Initiator != (Initiator{}) {
		in := e.Initiator
		env.Initiator = &in
	}
	if e.Payload != nil {
		if IsJSONType(e.PayloadType) && json.Valid(e.Payload) {
			env.Payload = e.Payload
		} else {
			b, _ := json.Marshal(base64.StdEncoding.EncodeToString(e.Payload))
			env.Payload = b
		}
	}
	return json.Marshal(env)
}

// UnmarshalJSON reads the plain JSON envelope written by MarshalJSON. It is
// lenient about representation (version may be a number or a numeric string,
// causationId is accepted for parentEventId) and strict about types: a field
// of the wrong JSON type is a *FieldError naming it. A payload whose
// payloadType is not JSON must be a base64 string. Unknown fields are
// ignored. It does not validate; call Prepare.
func (e *Event) UnmarshalJSON(b []byte) error {
	var env envelope
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&env); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return fieldErr(te.Field, "has the wrong JSON type (%s, want %s)", te.Value, te.Type)
		}
		return fmt.Errorf("envelope is not a JSON object: %w", err)
	}
	var errs []error
	*e = Event{
		ID: env.EventID, Type: env.EventType, Source: env.Source, Topic: env.Topic,
		AggregateType: env.AggregateType, AggregateID: env.AggregateID,
		SchemaVersion: env.SchemaVersion, PayloadType: env.PayloadType,
		TraceID: env.TraceID, SpanID: env.SpanID, ParentEventID: env.ParentEventID,
		CorrelationID: env.CorrelationID,
		SourceVersion: env.SourceVersion,
	}
	if e.ParentEventID == "" {
		e.ParentEventID = env.CausationID
	}
	if env.Initiator != nil {
		e.Initiator = *env.Initiator
	}
	if len(env.Version) > 0 && string(env.Version) != "null" {
		n, err := ParseVersion(string(bytes.Trim(env.Version, `"`)))
		if err != nil {
			errs = append(errs, err)
		}
		e.Version = n
	}
	if env.OccurredAt != "" {
		t, err := time.Parse(time.RFC3339Nano, env.OccurredAt)
		if err != nil {
			errs = append(errs, fieldErr("occurredAt", "must be an RFC 3339 timestamp"))
		}
		e.OccurredAt = t
	}
	if env.ExpireAt != "" {
		t, err := time.Parse(time.RFC3339Nano, env.ExpireAt)
		if err != nil {
			errs = append(errs, fieldErr("expireAt", "must be an RFC 3339 timestamp"))
		}
		e.ExpireAt = t
	}
	if env.DeliverAt != "" {
		t, err := time.Parse(time.RFC3339Nano, env.DeliverAt)
		if err != nil {
			errs = append(errs, fieldErr("deliverAt", "must be an RFC 3339 timestamp"))
		}
		e.DeliverAt = t
	}
	if len(env.Payload) > 0 && string(env.Payload) != "null" {
		if e.PayloadType == "" || IsJSONType(e.PayloadType) {
			e.Payload = []byte(env.Payload)
		} else {
			var s string
			if err := json.Unmarshal(env.Payload, &s); err != nil {
				errs = append(errs, fieldErr("payload", "must be a base64 string because payloadType %s is not JSON", e.PayloadType))
			} else if p, err := base64.StdEncoding.DecodeString(s); err != nil {
				errs = append(errs, fieldErr("payload", "must be a base64 string because payloadType %s is not JSON", e.PayloadType))
			} else {
				e.Payload = p
			}
		}
	}
	return errors.Join(errs...)
}
