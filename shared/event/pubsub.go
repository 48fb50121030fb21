package event

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Publisher sends one message to a topic and returns the message id the
// broker gave it: the one publish contract of relaybus, declared beside the
// message it carries (as Watermill's message.Publisher is), so the engines
// and functions that publish (consume's dead letters, the ledger's rollup
// notices, dlqreplay's replays) share it without importing a transport.
// *pubsub.Client (shared/broker/pubsub) and *nats.Client implement it.
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

// Pub/Sub attribute names: relaybus's required and optional set
// (docs/architecture.md "Attribute names"), plus the
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
	AttrSourceVersion = "source_version"
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
	// the payload type as content-type, beside relaybus's attributes. The
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
	put(AttrSourceVersion, e.SourceVersion)
	put(AttrCausationID, e.ParentEventID)
	put(AttrUserID, e.Initiator.UserID)
	put(AttrSourceService, e.Source)
	if !e.ExpireAt.IsZero() {
		a[AttrExpireAt] = e.ExpireAt.UTC().Format(time.RFC3339Nano)
	}
	return a
}

// UnknownSource is the source the decoder gives events whose producer named none
// (legacy producers may omit source_service).
const UnknownSource = "unknown"

// Decoding modes reported by the decoder (internal/cloudevent.Decode).
const (
	ModeStructuredJSON     = "structured-json"
	ModeStructuredProtobuf = "structured-protobuf"
	ModeBinary             = "binary"
	ModeLegacy             = "legacy"
)

// Decoded tells how the decoder read a message.
type Decoded struct {
	// Mode is one of the Mode* constants.
	Mode string
	// AggregateIDFrom is FromEnvelope, FromAttribute or FromOrderingKey.
	AggregateIDFrom string
}
