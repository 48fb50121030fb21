package event

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	pbformat "github.com/cloudevents/sdk-go/binding/format/protobuf/v2"
	cloudevents "github.com/cloudevents/sdk-go/v2/event"
)

// Publisher sends one message to a topic and returns the message id the
// broker gave it: the one publish contract of relaybus, declared beside the
// message it carries (as Watermill's message.Publisher is), so the engines
// and functions that publish (consume's dead letters, the ledger's rollup
// notices, dlqreplay's replays) share it without importing a transport.
// *transport.Client implements it for Pub/Sub.
type Publisher interface {
	// Publish sends m to topic (a topic id such as "shop.order.events") and
	// waits for the broker's answer.
	Publish(ctx context.Context, topic string, m Message) (messageID string, err error)
}

// Message is a Pub/Sub message as relaybus reads and writes it, independent of
// the client library and of how it was delivered (pull, push, Eventarc).
type Message struct {
	// ID is the Pub/Sub message id (empty before publishing).
	ID string
	// Data is the message body.
	Data []byte
	// Attributes are the message attributes.
	Attributes map[string]string
	// OrderingKey is the Pub/Sub ordering key.
	OrderingKey string
	// PublishTime is when Pub/Sub accepted the message (zero before publishing).
	PublishTime time.Time
	// DeliveryAttempt is Pub/Sub's delivery attempt counter, 0 when unknown.
	DeliveryAttempt int
	// Topic is the topic the message was published to, when the reader knows
	// it; it fills an event whose envelope names no topic.
	Topic string
}

// Pub/Sub attribute names: the seed's required and optional set, plus the
// CloudEvents Pub/Sub binding's content-type.
const (
	AttrContentType   = "content-type"
	AttrEventID       = "event_id"
	AttrEventType     = "event_type"
	AttrAggregateID   = "aggregate_id"
	AttrAggregateType = "aggregate_type"
	AttrVersion       = "version"
	AttrOccurredAt    = "occurred_at"
	AttrSchemaVersion = "schema_version"
	AttrTraceID       = "trace_id"
	AttrSpanID        = "span_id"
	AttrCorrelationID = "correlation_id"
	AttrCausationID   = "causation_id"
	AttrUserID        = "user_id"
	AttrSourceService = "source_service"
	AttrExpireAt      = "expire_at"
)

// Encoding is how the event is written into the message data.
type Encoding string

// Encodings a topic may ask for.
const (
	// EncodingJSON is CloudEvents structured mode, application/cloudevents+json.
	EncodingJSON Encoding = "json"
	// EncodingProtobuf is CloudEvents structured mode, application/cloudevents+protobuf.
	EncodingProtobuf Encoding = "protobuf"
	// EncodingBinary is CloudEvents binary mode: the message data is the
	// payload alone, the context attributes travel as ce-* attributes and
	// the payload type as content-type, beside the seed's attributes. The
	// relay writes it for a topic with a Pub/Sub schema, which validates the
	// data (https://cloud.google.com/pubsub/docs/schemas); it is not a
	// topology encoding.
	EncodingBinary Encoding = "binary"
)

// Media types of the structured formats.
const (
	MediaTypeCloudEventsJSON     = "application/cloudevents+json"
	MediaTypeCloudEventsProtobuf = "application/cloudevents+protobuf"
)

// ParseEncoding reads an encoding name; "" means JSON.
func ParseEncoding(s string) (Encoding, error) {
	switch Encoding(strings.ToLower(strings.TrimSpace(s))) {
	case "", EncodingJSON:
		return EncodingJSON, nil
	case EncodingProtobuf:
		return EncodingProtobuf, nil
	}
	return "", fmt.Errorf("unknown payload encoding %q: want json or protobuf", s)
}

// Encode writes e as a Pub/Sub message: the CloudEvent in structured mode in
// the data, the seed's attributes mirrored, and the aggregate id as ordering
// key. It fails with a *FieldError matching ErrTooLarge if the data would
// exceed Pub/Sub's limit. Encode does not validate; entry points validate
// before they store an event.
func Encode(e *Event, enc Encoding) (Message, error) {
	if enc == EncodingBinary {
		return encodeBinary(e)
	}
	ce := e.CloudEvent()
	var (
		data []byte
		err  error
		ct   string
	)
	switch enc {
	case EncodingJSON, "":
		ct = MediaTypeCloudEventsJSON
		data, err = ce.MarshalJSON()
	case EncodingProtobuf:
		ct = MediaTypeCloudEventsProtobuf
		data, err = pbformat.Protobuf.Marshal(&ce)
	default:
		return Message{}, fmt.Errorf("encode event %s: unknown encoding %q", e.ID, enc)
	}
	if err != nil {
		return Message{}, fmt.Errorf("encode event %s as %s: %w", e.ID, ct, err)
	}
	if len(data) > PubSubMaxMessageBytes {
		return Message{}, &FieldError{Field: "payload", Rule: fmt.Sprintf("the encoded event is %d bytes, over Pub/Sub's %d", len(data), PubSubMaxMessageBytes), tooLarge: true}
	}
	return Message{
		Data:        data,
		Attributes:  Attributes(e, ct),
		OrderingKey: e.AggregateID,
	}, nil
}

// encodeBinary writes e in CloudEvents binary mode (EncodingBinary).
func encodeBinary(e *Event) (Message, error) {
	if len(e.Payload) > PubSubMaxMessageBytes {
		return Message{}, &FieldError{Field: "payload", Rule: fmt.Sprintf("the payload is %d bytes, over Pub/Sub's %d", len(e.Payload), PubSubMaxMessageBytes), tooLarge: true}
	}
	ce := e.CloudEvent()
	a := Attributes(e, e.PayloadType)
	a["ce-specversion"] = ce.SpecVersion()
	a["ce-id"] = ce.ID()
	a["ce-type"] = ce.Type()
	a["ce-source"] = ce.Source()
	if s := ce.Subject(); s != "" {
		a["ce-subject"] = s
	}
	if !e.OccurredAt.IsZero() {
		a["ce-time"] = e.OccurredAt.UTC().Format(time.RFC3339Nano)
	}
	for name, v := range ce.Extensions() {
		if s, ok := v.(string); ok && s != "" {
			a["ce-"+name] = s
		}
	}
	return Message{Data: e.Payload, Attributes: a, OrderingKey: e.AggregateID}, nil
}

// Attributes returns the Pub/Sub attributes relaybus mirrors from an event,
// with contentType as the content-type attribute (omitted when empty).
func Attributes(e *Event, contentType string) map[string]string {
	a := make(map[string]string, 16)
	put := func(k, v string) {
		if v != "" {
			a[k] = v
		}
	}
	put(AttrContentType, contentType)
	put(AttrEventID, e.ID)
	put(AttrEventType, e.Type)
	put(AttrAggregateID, e.AggregateID)
	put(AttrAggregateType, e.AggregateType)
	if e.Version != 0 {
		a[AttrVersion] = strconv.FormatInt(e.Version, 10)
	}
	if !e.OccurredAt.IsZero() {
		a[AttrOccurredAt] = e.OccurredAt.UTC().Format(time.RFC3339Nano)
	}
	put(AttrSchemaVersion, e.SchemaVersion)
	put(AttrTraceID, e.TraceID)
	put(AttrSpanID, e.SpanID)
	put(AttrCorrelationID, e.CorrelationID)
	put(AttrCausationID, e.ParentEventID)
	put(AttrUserID, e.Initiator.UserID)
	put(AttrSourceService, e.Source)
	if !e.ExpireAt.IsZero() {
		a[AttrExpireAt] = e.ExpireAt.UTC().Format(time.RFC3339Nano)
	}
	return a
}

// UnknownSource is the source Decode gives events whose producer named none
// (legacy producers may omit source_service).
const UnknownSource = "unknown"

// Decoding modes reported by Decode.
const (
	ModeStructuredJSON     = "structured-json"
	ModeStructuredProtobuf = "structured-protobuf"
	ModeBinary             = "binary"
	ModeLegacy             = "legacy"
)

// Decoded tells how Decode read a message.
type Decoded struct {
	// Mode is one of the Mode* constants.
	Mode string
	// AggregateIDFrom is FromEnvelope, FromAttribute or FromOrderingKey.
	AggregateIDFrom string
}

// Decode reads an event out of a Pub/Sub message, whatever shape a producer
// gave it (see the package documentation), fills what the envelope lacks from
// the attributes, the message's topic and its publish time, extracts the
// aggregate id, normalizes and validates. Every failure is a *DecodeError
// whose Reason says why; such a message can never succeed and is poison.
func Decode(m Message, lim Limits) (Event, Decoded, error) {
	e, mode, err := decodeShape(m)
	if err != nil {
		return Event{}, Decoded{Mode: mode}, &DecodeError{Reason: ReasonMalformed, Err: err}
	}
	info := Decoded{Mode: mode}
	fillFromAttributes(&e, m.Attributes)
	if e.Topic == "" {
		e.Topic = m.Topic
	}
	if e.OccurredAt.IsZero() {
		e.OccurredAt = m.PublishTime
	}
	if e.Source == "" {
		e.Source = UnknownSource
	}
	id, from, err := ExtractAggregateID(e.AggregateID, m.Attributes[AttrAggregateID], m.OrderingKey)
	info.AggregateIDFrom = from
	if errors.Is(err, ErrNoAggregateID) {
		return Event{}, info, &DecodeError{Reason: ReasonMissingAggregateID, Err: err}
	}
	if err != nil {
		return Event{}, info, &DecodeError{Reason: ReasonInvalidAggregateID, Err: err}
	}
	e.AggregateID = id
	e.Normalize()
	if err := e.Validate(lim); err != nil {
		reason := ReasonInvalid
		if errors.Is(err, ErrTooLarge) {
			reason = ReasonTooLarge
		}
		return Event{}, info, &DecodeError{Reason: reason, Err: err}
	}
	return e, info, nil
}

// decodeShape reads the envelope in whichever mode the message uses.
func decodeShape(m Message) (Event, string, error) {
	ct := strings.ToLower(strings.TrimSpace(m.Attributes[AttrContentType]))
	switch {
	case strings.HasPrefix(ct, MediaTypeCloudEventsProtobuf):
		var ce cloudevents.Event
		if err := pbformat.Protobuf.Unmarshal(m.Data, &ce); err != nil {
			return Event{}, ModeStructuredProtobuf, fmt.Errorf("data is not a protobuf CloudEvent: %w", err)
		}
		e, err := FromCloudEvent(ce)
		return e, ModeStructuredProtobuf, err
	case strings.HasPrefix(ct, MediaTypeCloudEventsJSON):
		e, err := decodeStructuredJSON(m.Data)
		return e, ModeStructuredJSON, err
	case hasBinaryAttributes(m.Attributes):
		e, err := decodeBinary(m)
		return e, ModeBinary, err
	case ct == "" && looksLikeStructuredJSON(m.Data):
		e, err := decodeStructuredJSON(m.Data)
		return e, ModeStructuredJSON, err
	}
	// Legacy: attributes only, the data is the payload.
	// Without a content-type, a payload that is not JSON is opaque bytes
	// (legacy producers publish protobuf this way).
	e := Event{Payload: m.Data, PayloadType: m.Attributes[AttrContentType]}
	if len(e.Payload) == 0 {
		e.Payload = nil
	}
	if e.PayloadType == "" && e.Payload != nil && !json.Valid(e.Payload) {
		e.PayloadType = "application/octet-stream"
	}
	return e, ModeLegacy, nil
}

func decodeStructuredJSON(data []byte) (Event, error) {
	var ce cloudevents.Event
	if err := ce.UnmarshalJSON(data); err != nil {
		return Event{}, fmt.Errorf("data is not a JSON CloudEvent: %w", err)
	}
	return FromCloudEvent(ce)
}

// looksLikeStructuredJSON spots a JSON CloudEvent whose producer forgot the
// content-type attribute.
func looksLikeStructuredJSON(data []byte) bool {
	d := bytes.TrimSpace(data)
	return len(d) > 0 && d[0] == '{' && bytes.Contains(d, []byte(`"specversion"`))
}

func hasBinaryAttributes(a map[string]string) bool {
	_, ok := a["ce-specversion"]
	if !ok {
		_, ok = a["ce-id"]
	}
	return ok
}

// decodeBinary reads a binary-mode CloudEvent: context attributes as ce-*
// attributes, the data is the payload, content-type is datacontenttype.
func decodeBinary(m Message) (Event, error) {
	ce := cloudevents.New(cloudevents.CloudEventsVersionV1)
	var errs []error
	for k, v := range m.Attributes {
		name, ok := strings.CutPrefix(strings.ToLower(k), "ce-")
		if !ok {
			continue
		}
		switch name {
		case "specversion":
			if v != cloudevents.CloudEventsVersionV1 {
				errs = append(errs, fmt.Errorf("ce-specversion %q is not supported (want 1.0)", v))
			}
		case "id":
			ce.SetID(v)
		case "type":
			ce.SetType(v)
		case "source":
			ce.SetSource(v)
		case "subject":
			ce.SetSubject(v)
		case "time":
			t, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				errs = append(errs, fieldErr("occurredAt", "ce-time must be an RFC 3339 timestamp"))
				continue
			}
			ce.SetTime(t)
		case "dataschema":
			ce.SetDataSchema(v)
		default:
			if cloudevents.IsExtensionNameValid(name) {
				ce.SetExtension(name, v)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return Event{}, err
	}
	if ct := m.Attributes[AttrContentType]; ct != "" {
		ce.SetDataContentType(ct)
	}
	if len(m.Data) > 0 {
		ce.DataEncoded = m.Data
	}
	return FromCloudEvent(ce)
}

// fillFromAttributes fills fields the envelope left empty from the mirrored
// attributes (the legacy shape has nothing else).
func fillFromAttributes(e *Event, a map[string]string) {
	fill := func(dst *string, key string) {
		if *dst == "" {
			*dst = strings.TrimSpace(a[key])
		}
	}
	fill(&e.ID, AttrEventID)
	fill(&e.Type, AttrEventType)
	fill(&e.AggregateType, AttrAggregateType)
	fill(&e.SchemaVersion, AttrSchemaVersion)
	fill(&e.TraceID, AttrTraceID)
	fill(&e.SpanID, AttrSpanID)
	fill(&e.CorrelationID, AttrCorrelationID)
	fill(&e.ParentEventID, AttrCausationID)
	fill(&e.Initiator.UserID, AttrUserID)
	fill(&e.Source, AttrSourceService)
	if e.Version == 0 {
		if n, err := strconv.ParseInt(strings.TrimSpace(a[AttrVersion]), 10, 64); err == nil {
			e.Version = n
		}
	}
	if e.OccurredAt.IsZero() {
		if t, err := time.Parse(time.RFC3339Nano, a[AttrOccurredAt]); err == nil {
			e.OccurredAt = t
		}
	}
	if e.ExpireAt.IsZero() {
		if t, err := time.Parse(time.RFC3339Nano, a[AttrExpireAt]); err == nil {
			e.ExpireAt = t
		}
	}
}
