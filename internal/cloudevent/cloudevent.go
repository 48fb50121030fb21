package cloudevent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	pbformat "github.com/cloudevents/sdk-go/binding/format/protobuf/v2"
	cloudevents "github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"

	"github.com/relaybus/relaybus/shared/event"
)

// FromEvent returns e as a CloudEvents 1.0 event of the CloudEvents SDK.
// Empty optional fields are left out. The payload is carried as-is:
// inline JSON for JSON payload types, base64 otherwise. Its attributes are
// e.CloudEventAttributes().
func FromEvent(e *event.Event) cloudevents.Event {
	ce := cloudevents.New(cloudevents.CloudEventsVersionV1)
	ce.SetID(e.ID)
	ce.SetType(e.Type)
	ce.SetSource(e.Source)
	if e.AggregateID != "" {
		ce.SetSubject(e.AggregateID)
	}
	if !e.OccurredAt.IsZero() {
		ce.SetTime(e.OccurredAt)
	}
	if e.PayloadType != "" {
		ce.SetDataContentType(e.PayloadType)
	}
	if e.Payload != nil {
		ce.DataEncoded = e.Payload
		ce.DataBase64 = !event.IsJSONType(e.PayloadType)
	}
	set := func(name, value string) {
		if value != "" {
			ce.SetExtension(name, value)
		}
	}
	set(event.ExtTopic, e.Topic)
	set(event.ExtAggregateType, e.AggregateType)
	if e.Version != 0 {
		set(event.ExtVersion, strconv.FormatInt(e.Version, 10))
	}
	set(event.ExtSchemaVersion, e.SchemaVersion)
	set(event.ExtTraceID, e.TraceID)
	set(event.ExtSpanID, e.SpanID)
	set(event.ExtCausationID, e.ParentEventID)
	set(event.ExtCorrelationID, e.CorrelationID)
	set(event.ExtSourceVersion, e.SourceVersion)
	set(event.ExtInitiatorService, e.Initiator.Service)
	set(event.ExtInitiatorOperation, e.Initiator.Operation)
	set(event.ExtInitiatorUserID, e.Initiator.UserID)
	set(event.ExtInitiatorRequestID, e.Initiator.ClientRequestID)
	if !e.ExpireAt.IsZero() {
		set(event.ExtExpireAt, e.ExpireAt.UTC().Format(time.RFC3339Nano))
	}
	return ce
}

// ToEvent reads an event out of a CloudEvent. It reports unparsable
// attributes (a version that is not an integer, an expireat that is not a
// timestamp) as field errors but does not otherwise validate: call Normalize
// and Validate, or Prepare, on the result.
func ToEvent(ce cloudevents.Event) (event.Event, error) {
	e := event.Event{
		ID:          ce.ID(),
		Type:        ce.Type(),
		Source:      ce.Source(),
		AggregateID: ce.Subject(),
		OccurredAt:  ce.Time(),
		PayloadType: ce.DataContentType(),
		Payload:     ce.Data(),
	}
	ext := ce.Extensions()
	str := func(name string) string {
		v, ok := ext[name]
		if !ok {
			return ""
		}
		s, err := types.ToString(v)
		if err != nil {
			return fmt.Sprint(v)
		}
		return s
	}
	var errs []error
	e.Topic = str(event.ExtTopic)
	e.AggregateType = str(event.ExtAggregateType)
	if v := str(event.ExtVersion); v != "" {
		n, err := event.ParseVersion(strings.TrimSpace(v))
		if err != nil {
			errs = append(errs, err)
		}
		e.Version = n
	}
	e.SchemaVersion = str(event.ExtSchemaVersion)
	e.TraceID = str(event.ExtTraceID)
	e.SpanID = str(event.ExtSpanID)
	e.ParentEventID = str(event.ExtCausationID)
	e.CorrelationID = str(event.ExtCorrelationID)
	e.SourceVersion = str(event.ExtSourceVersion)
	e.Initiator = event.Initiator{
		Service:         str(event.ExtInitiatorService),
		Operation:       str(event.ExtInitiatorOperation),
		UserID:          str(event.ExtInitiatorUserID),
		ClientRequestID: str(event.ExtInitiatorRequestID),
	}
	if v, ok := ext[event.ExtExpireAt]; ok {
		t, err := types.ToTime(v)
		if err != nil {
			errs = append(errs, &event.FieldError{Field: "expireAt", Rule: "must be an RFC 3339 timestamp"})
		}
		e.ExpireAt = t
	}
	if v, ok := ext[event.ExtDeliverAt]; ok {
		t, err := types.ToTime(v)
		if err != nil {
			errs = append(errs, &event.FieldError{Field: "deliverAt", Rule: "must be an RFC 3339 timestamp (CloudEvents extension deliverat)"})
		}
		e.DeliverAt = t
	}
	return e, errors.Join(errs...)
}

// Encode writes e as a Pub/Sub message: the CloudEvent in structured mode in
// the data, relaybus's attributes mirrored, and the aggregate id as ordering
// key. It fails with a *event.FieldError matching event.ErrTooLarge if the data would
// exceed Pub/Sub's limit. Encode does not validate; entry points validate
// before they store an event.
func Encode(e *event.Event, enc event.Encoding) (event.Message, error) {
	return encode(e, enc, true)
}

// EncodeLarge is Encode without Pub/Sub's size limit: for a sender whose
// large messages travel by claim check (internal/claimcheck), which takes
// the data out of the message before it is sent.
func EncodeLarge(e *event.Event, enc event.Encoding) (event.Message, error) {
	return encode(e, enc, false)
}

func encode(e *event.Event, enc event.Encoding, bounded bool) (event.Message, error) {
	if enc == event.EncodingBinary {
		return encodeBinary(e, bounded)
	}
	ce := FromEvent(e)
	var (
		data []byte
		err  error
		ct   string
	)
	switch enc {
	case event.EncodingJSON, "":
		ct = event.MediaTypeCloudEventsJSON
		data, err = ce.MarshalJSON()
	case event.EncodingProtobuf:
		ct = event.MediaTypeCloudEventsProtobuf
		data, err = pbformat.Protobuf.Marshal(&ce)
	default:
		return event.Message{}, fmt.Errorf("encode event %s: unknown encoding %q", e.ID, enc)
	}
	if err != nil {
		return event.Message{}, fmt.Errorf("encode event %s as %s: %w", e.ID, ct, err)
	}
	if bounded && len(data) > event.PubSubMaxMessageBytes {
		return event.Message{}, event.TooLarge("payload", fmt.Sprintf("the encoded event is %d bytes, over Pub/Sub's %d", len(data), event.PubSubMaxMessageBytes))
	}
	return event.Message{
		Data:        data,
		Attributes:  event.Attributes(e, ct),
		OrderingKey: e.AggregateID,
	}, nil
}

// encodeBinary writes e in CloudEvents binary mode (event.EncodingBinary).
func encodeBinary(e *event.Event, bounded bool) (event.Message, error) {
	if bounded && len(e.Payload) > event.PubSubMaxMessageBytes {
		return event.Message{}, event.TooLarge("payload", fmt.Sprintf("the payload is %d bytes, over Pub/Sub's %d", len(e.Payload), event.PubSubMaxMessageBytes))
	}
	ce := FromEvent(e)
	a := event.Attributes(e, e.PayloadType)
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
	return event.Message{Data: e.Payload, Attributes: a, OrderingKey: e.AggregateID}, nil
}

// Decode reads an event out of a Pub/Sub message, whatever shape a producer
// gave it (see the package documentation), fills what the envelope lacks from
// the attributes, the message's topic and its publish time, extracts the
// aggregate id, normalizes and validates. Every failure is a *event.DecodeError
// whose Reason says why; such a message can never succeed and is poison.
func Decode(m event.Message, lim event.Limits) (event.Event, event.Decoded, error) {
	e, mode, err := decodeShape(m)
	if err != nil {
		return event.Event{}, event.Decoded{Mode: mode}, &event.DecodeError{Reason: event.ReasonMalformed, Err: err}
	}
	info := event.Decoded{Mode: mode}
	fillFromAttributes(&e, m.Attributes)
	if e.Topic == "" {
		e.Topic = m.Topic
	}
	if e.OccurredAt.IsZero() {
		e.OccurredAt = m.PublishTime
	}
	if e.Source == "" {
		e.Source = event.UnknownSource
	}
	id, from, err := event.ExtractAggregateID(e.AggregateID, m.Attributes[event.AttrAggregateID], m.OrderingKey)
	info.AggregateIDFrom = from
	if errors.Is(err, event.ErrNoAggregateID) {
		return event.Event{}, info, &event.DecodeError{Reason: event.ReasonMissingAggregateID, Err: err}
	}
	if err != nil {
		return event.Event{}, info, &event.DecodeError{Reason: event.ReasonInvalidAggregateID, Err: err}
	}
	e.AggregateID = id
	e.Normalize()
	if err := e.Validate(lim); err != nil {
		reason := event.ReasonInvalid
		if errors.Is(err, event.ErrTooLarge) {
			reason = event.ReasonTooLarge
		}
		return event.Event{}, info, &event.DecodeError{Reason: reason, Err: err}
	}
	return e, info, nil
}

// decodeShape reads the envelope in whichever mode the message uses.
func decodeShape(m event.Message) (event.Event, string, error) {
	ct := strings.ToLower(strings.TrimSpace(m.Attributes[event.AttrContentType]))
	switch {
	case strings.HasPrefix(ct, event.MediaTypeCloudEventsProtobuf):
		var ce cloudevents.Event
		if err := pbformat.Protobuf.Unmarshal(m.Data, &ce); err != nil {
			return event.Event{}, event.ModeStructuredProtobuf, fmt.Errorf("data is not a protobuf CloudEvent: %w", err)
		}
		e, err := ToEvent(ce)
		return e, event.ModeStructuredProtobuf, err
	case strings.HasPrefix(ct, event.MediaTypeCloudEventsJSON):
		e, err := decodeStructuredJSON(m.Data)
		return e, event.ModeStructuredJSON, err
	case hasBinaryAttributes(m.Attributes):
		e, err := decodeBinary(m)
		return e, event.ModeBinary, err
	case ct == "" && looksLikeStructuredJSON(m.Data):
		e, err := decodeStructuredJSON(m.Data)
		return e, event.ModeStructuredJSON, err
	}
	// Legacy: attributes only, the data is the payload.
	// Without a content-type, a payload that is not JSON is opaque bytes
	// (legacy producers publish protobuf this way).
	e := event.Event{Payload: m.Data, PayloadType: m.Attributes[event.AttrContentType]}
	if len(e.Payload) == 0 {
		e.Payload = nil
	}
	if e.PayloadType == "" && e.Payload != nil && !json.Valid(e.Payload) {
		e.PayloadType = "application/octet-stream"
	}
	return e, event.ModeLegacy, nil
}

func decodeStructuredJSON(data []byte) (event.Event, error) {
	var ce cloudevents.Event
	if err := ce.UnmarshalJSON(data); err != nil {
		return event.Event{}, fmt.Errorf("data is not a JSON CloudEvent: %w", err)
	}
	return ToEvent(ce)
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
func decodeBinary(m event.Message) (event.Event, error) {
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
				errs = append(errs, &event.FieldError{Field: "occurredAt", Rule: "ce-time must be an RFC 3339 timestamp"})
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
		return event.Event{}, err
	}
	if ct := m.Attributes[event.AttrContentType]; ct != "" {
		ce.SetDataContentType(ct)
	}
	if len(m.Data) > 0 {
		ce.DataEncoded = m.Data
	}
	return ToEvent(ce)
}

// fillFromAttributes fills fields the envelope left empty from the mirrored
// attributes (the legacy shape has nothing else).
func fillFromAttributes(e *event.Event, a map[string]string) {
	fill := func(dst *string, key string) {
		if *dst == "" {
			*dst = strings.TrimSpace(a[key])
		}
	}
	fill(&e.ID, event.AttrEventID)
	fill(&e.Type, event.AttrEventType)
	fill(&e.AggregateType, event.AttrAggregateType)
	fill(&e.SchemaVersion, event.AttrSchemaVersion)
	fill(&e.TraceID, event.AttrTraceID)
	fill(&e.SpanID, event.AttrSpanID)
	fill(&e.CorrelationID, event.AttrCorrelationID)
	fill(&e.SourceVersion, event.AttrSourceVersion)
	fill(&e.ParentEventID, event.AttrCausationID)
	fill(&e.Initiator.UserID, event.AttrUserID)
	fill(&e.Source, event.AttrSourceService)
	if e.Version == 0 {
		if n, err := strconv.ParseInt(strings.TrimSpace(a[event.AttrVersion]), 10, 64); err == nil {
			e.Version = n
		}
	}
	if e.OccurredAt.IsZero() {
		if t, err := time.Parse(time.RFC3339Nano, a[event.AttrOccurredAt]); err == nil {
			e.OccurredAt = t
		}
	}
	if e.ExpireAt.IsZero() {
		if t, err := time.Parse(time.RFC3339Nano, a[event.AttrExpireAt]); err == nil {
			e.ExpireAt = t
		}
	}
}
