package event

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"mime"
	"strconv"
	"strings"
	"time"

	"github.com/relaybus/relaybus/internal/names"
)

// Event is one business fact: one eventId, one aggregate version, one payload.
// The zero value is not valid; build events with their fields and call
// [Event.Normalize] and [Event.Validate] (or [Event.Prepare], which does both)
// before storing or sending them.
type Event struct {
	// ID is the globally unique event id (CloudEvents id). It is the
	// idempotency key of the outbox, the inboxes and the ledger.
	ID string
	// Type is the event type, past tense, dot-separated: "order.purchased".
	Type string
	// Source names the producing service (CloudEvents source), "order-service".
	Source string
	// Topic is the Pub/Sub topic the event is published to.
	Topic string
	// AggregateType is the kind of aggregate the event belongs to, "order".
	AggregateType string
	// AggregateID identifies the aggregate; it is the Pub/Sub ordering key.
	AggregateID string
	// Version is the aggregate's version after this event, from 1, increasing
	// by one per event of the aggregate.
	Version int64
	// OccurredAt is when the fact happened (CloudEvents time).
	OccurredAt time.Time
	// SchemaVersion is the payload's schema version, "v1", "v2", ...
	SchemaVersion string
	// PayloadType is the payload's media type (CloudEvents datacontenttype).
	PayloadType string
	// Payload is the business data, opaque to relaybus except that a JSON
	// PayloadType requires valid JSON.
	Payload []byte
	// TraceID groups every event of one business process.
	TraceID string
	// SpanID identifies this event's step within the trace.
	SpanID string
	// ParentEventID is the id of the event whose consumption emitted this one
	// (the causation id).
	ParentEventID string
	// CorrelationID ties the event to a request or conversation.
	CorrelationID string
	// SourceVersion is the producer's own version (its release, build or
	// Cloud Run revision) when it wrote the event, from its configuration.
	SourceVersion string
	// Initiator says who caused the event.
	Initiator Initiator
	// ExpireAt, when set, is when the event stops mattering: it is not
	// re-pushed after that and its ledger status becomes EXPIRED.
	ExpireAt time.Time
	// DeliverAt, when set, schedules the event: the outbox holds it, and
	// the versions of its aggregate after it, until then (see
	// docs/producing.md, "Scheduled events"). It is an instruction to the
	// outbox, not part of the published message. A time at or before now
	// is due at once; one more than MaxDeliverDelay ahead is refused.
	DeliverAt time.Time
}

// MaxDeliverDelay is how far ahead an event may be scheduled (DeliverAt):
// a scheduled version holds its aggregate's later versions, so the bound
// also bounds how long an aggregate can be held.
const MaxDeliverDelay = 30 * 24 * time.Hour

// Initiator says who caused an event.
type Initiator struct {
	Service         string `json:"service,omitempty"`
	Operation       string `json:"operation,omitempty"`
	UserID          string `json:"userId,omitempty"`
	ClientRequestID string `json:"clientRequestId,omitempty"`
}

// Defaults used by Normalize.
const (
	// DefaultSchemaVersion is the schema version of events that name none.
	DefaultSchemaVersion = "v1"
	// DefaultPayloadType is the payload type of events that name none.
	DefaultPayloadType = "application/json"
)

// Size limits. Pub/Sub refuses messages over 10 MB; relaybus keeps headroom
// for the envelope and attributes so that an accepted payload always fits.
const (
	// PubSubMaxMessageBytes is Pub/Sub's limit on a message's data.
	PubSubMaxMessageBytes = 10_000_000
	// MaxPayloadLimit is the largest payload limit a deployment may configure.
	MaxPayloadLimit = PubSubMaxMessageBytes - 64*1024
	// DefaultPayloadLimit is the payload limit when none is configured (1 MiB).
	DefaultPayloadLimit = 1 << 20
	// MaxBinaryPayload is the largest payload that is not JSON: such payloads
	// are base64-encoded in the message, which grows them by a third.
	MaxBinaryPayload = MaxPayloadLimit / 4 * 3
)

// Limits bounds what Validate accepts.
type Limits struct {
	// MaxPayloadBytes caps the payload size. Zero means DefaultPayloadLimit;
	// values above MaxPayloadLimit (MaxClaimCheckPayload with ClaimCheck)
	// are treated as that.
	MaxPayloadBytes int
	// ClaimCheck says a payload too large for a message travels by claim
	// check (see AttrClaimCheck): the cap is MaxClaimCheckPayload instead
	// of MaxPayloadLimit, and a payload that is not JSON is not bounded by
	// its base64 encoding's size in the message.
	ClaimCheck bool
}

// PayloadLimit returns the effective payload limit.
func (l Limits) PayloadLimit() int {
	switch {
	case l.MaxPayloadBytes <= 0:
		return DefaultPayloadLimit
	case l.ClaimCheck && l.MaxPayloadBytes > MaxClaimCheckPayload:
		return MaxClaimCheckPayload
	case !l.ClaimCheck && l.MaxPayloadBytes > MaxPayloadLimit:
		return MaxPayloadLimit
	}
	return l.MaxPayloadBytes
}

// Field rules, quoted in errors.
const (
	ruleID            = "required: 1 to 128 characters of [A-Za-z0-9._:-], not \".\" or \"..\""
	ruleType          = "required: 1 to 128 characters, dot-separated words of [A-Za-z0-9_-] (e.g. order.purchased)"
	ruleSource        = "required: 1 to 256 printable characters without spaces"
	ruleAggregateType = "required: 1 to 64 characters of [a-z0-9_-], starting with a letter"
	ruleAggregateID   = "required: 1 to 256 characters of [A-Za-z0-9:_-] after trimming spaces"
	ruleVersion       = "required: an integer of at least 1 (the aggregate's version after this event)"
	ruleSchemaVersion = "must be v followed by a number (v1, v2, ...)"
	ruleOccurredAt    = "required: an RFC 3339 timestamp"
	ruleTrace         = "at most 128 characters of [A-Za-z0-9._:-]"
	ruleText          = "at most 256 printable characters"
)

// Normalize fills defaults and canonical forms without judging validity:
// trims the aggregate id, defaults the schema version, payload type, aggregate
// type (the topic's middle segment) and source (the initiator's service), and
// converts times to UTC. It is idempotent.
func (e *Event) Normalize() {
	e.AggregateID = strings.TrimSpace(e.AggregateID)
	if e.SchemaVersion == "" {
		e.SchemaVersion = DefaultSchemaVersion
	}
	if e.PayloadType == "" {
		e.PayloadType = DefaultPayloadType
	}
	if e.AggregateType == "" {
		if segs := strings.Split(e.Topic, "."); len(segs) == 3 {
			e.AggregateType = segs[1]
		}
	}
	if e.Source == "" {
		e.Source = e.Initiator.Service
	}
	if !e.OccurredAt.IsZero() {
		e.OccurredAt = e.OccurredAt.UTC()
	}
	if !e.ExpireAt.IsZero() {
		e.ExpireAt = e.ExpireAt.UTC()
	}
	if !e.DeliverAt.IsZero() {
		e.DeliverAt = e.DeliverAt.UTC()
	}
}

// Prepare is what every entry point does to an event it accepts: fill what the
// caller may leave out (an id, the occurrence time, a trace id), normalize, and
// validate. now supplies the time for a missing OccurredAt.
func (e *Event) Prepare(now time.Time, lim Limits) error {
	if e.ID == "" {
		e.ID = NewID()
	}
	if e.OccurredAt.IsZero() {
		e.OccurredAt = now
	}
	if e.TraceID == "" {
		e.TraceID = NewTraceID()
	}
	e.Normalize()
	err := e.Validate(lim)
	if fe := e.checkDeliverAt(now); fe != nil {
		err = errors.Join(err, fe)
	}
	return err
}

// ruleDeliverAt is deliverAt's rule, quoted in errors.
const ruleDeliverAt = "an RFC 3339 timestamp at most 720h0m0s (30 days) after now"

// checkDeliverAt refuses a DeliverAt more than MaxDeliverDelay after now.
func (e *Event) checkDeliverAt(now time.Time) *FieldError {
	if e.DeliverAt.IsZero() || !e.DeliverAt.After(now.Add(MaxDeliverDelay)) {
		return nil
	}
	return fieldErr("deliverAt", "%s (got %s, %s ahead)", ruleDeliverAt,
		e.DeliverAt.Format(time.RFC3339), e.DeliverAt.Sub(now).Round(time.Second))
}

// Validate checks every field against its rule and returns all violations
// joined, or nil. It does not modify the event; call Normalize first.
func (e *Event) Validate(lim Limits) error {
	var errs []error
	add := func(fe *FieldError) { errs = append(errs, fe) }

	if !validID(e.ID) {
		add(fieldErr("eventId", ruleID))
	}
	if !validType(e.Type) {
		add(fieldErr("eventType", ruleType))
	}
	if !validSource(e.Source) {
		add(fieldErr("source", ruleSource))
	}
	if err := names.ValidateTopic(e.Topic); err != nil {
		add(fieldErr("topic", "%s", names.TopicRule))
	}
	if !validAggregateType(e.AggregateType) {
		add(fieldErr("aggregateType", ruleAggregateType))
	}
	if err := ValidateAggregateID(e.AggregateID); err != nil {
		add(fieldErr("aggregateId", ruleAggregateID))
	}
	if e.Version < 1 {
		add(fieldErr("version", ruleVersion))
	}
	if e.OccurredAt.IsZero() {
		add(fieldErr("occurredAt", ruleOccurredAt))
	}
	if !validSchemaVersion(e.SchemaVersion) {
		add(fieldErr("schemaVersion", ruleSchemaVersion))
	}
	if !validMediaType(e.PayloadType) {
		add(fieldErr("payloadType", "must be a media type such as application/json"))
	}
	jsonPayload := IsJSONType(e.PayloadType)
	if n, limit := len(e.Payload), lim.PayloadLimit(); n > limit {
		add(&FieldError{Field: "payload", Rule: "at most " + strconv.Itoa(limit) + " bytes (got " + strconv.Itoa(n) + ")", tooLarge: true})
	} else if !jsonPayload && !lim.ClaimCheck && base64.StdEncoding.EncodedLen(n) > MaxPayloadLimit {
		// Payloads that are not JSON travel base64-encoded inside the
		// structured CloudEvent; refuse now what Pub/Sub would refuse later.
		add(&FieldError{Field: "payload", Rule: "at most " + strconv.Itoa(MaxBinaryPayload) + " bytes for a payload that is not JSON, which travels base64-encoded (got " + strconv.Itoa(n) + ")", tooLarge: true})
	} else if jsonPayload && !json.Valid(e.Payload) {
		add(fieldErr("payload", "must be valid JSON because payloadType is %s", e.PayloadType))
	}
	for _, f := range []struct{ name, value string }{
		{"traceId", e.TraceID}, {"spanId", e.SpanID}, {"parentEventId", e.ParentEventID}, {"correlationId", e.CorrelationID},
		{"sourceVersion", e.SourceVersion},
	} {
		if f.value != "" && !validToken(f.value, 128) {
			add(fieldErr(f.name, ruleTrace))
		}
	}
	for _, f := range []struct{ name, value string }{
		{"initiator.service", e.Initiator.Service}, {"initiator.operation", e.Initiator.Operation},
		{"initiator.userId", e.Initiator.UserID}, {"initiator.clientRequestId", e.Initiator.ClientRequestID},
	} {
		if !validText(f.value, 256) {
			add(fieldErr(f.name, ruleText))
		}
	}
	if !e.ExpireAt.IsZero() && !e.OccurredAt.IsZero() && !e.ExpireAt.After(e.OccurredAt) {
		add(fieldErr("expireAt", "must be later than occurredAt"))
	}
	return errors.Join(errs...)
}

// Expired reports whether the event has an ExpireAt at or before now.
func (e *Event) Expired(now time.Time) bool {
	return !e.ExpireAt.IsZero() && !now.Before(e.ExpireAt)
}

// IsJSONType reports whether a media type is JSON (application/json or any
// +json suffix type).
func IsJSONType(mediaType string) bool {
	if mediaType == DefaultPayloadType {
		return true // the common case, without parsing (which allocates)
	}
	mt, _, err := mime.ParseMediaType(mediaType)
	if err != nil {
		mt = strings.ToLower(strings.TrimSpace(mediaType))
	}
	return mt == "application/json" || mt == "text/json" || strings.HasSuffix(mt, "+json")
}

// validMediaType reports whether s parses as a media type.
func validMediaType(s string) bool {
	if s == DefaultPayloadType {
		return true // the common case, without parsing (which allocates)
	}
	mt, _, err := mime.ParseMediaType(s)
	return err == nil && mt != ""
}

// NewID returns a random UUIDv4 string for events whose producer sent no id.
func NewID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = (b[6] & 0x0f) | 0x40
	b[8] = (b[8] & 0x3f) | 0x80
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:], b[10:])
	return string(s[:])
}

// NewTraceID returns a random W3C trace id (32 lowercase hex digits).
func NewTraceID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// NewSpanID returns a random W3C span id (16 lowercase hex digits).
func NewSpanID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func validID(s string) bool {
	return s != "." && s != ".." && validToken(s, 128)
}

// validToken: 1..max characters of [A-Za-z0-9._:-].
func validToken(s string, max int) bool {
	if len(s) == 0 || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(isAlnum(c) || c == '.' || c == '_' || c == ':' || c == '-') {
			return false
		}
	}
	return true
}

func validType(s string) bool {
	if len(s) == 0 || len(s) > 128 {
		return false
	}
	for _, word := range strings.Split(s, ".") {
		if word == "" {
			return false
		}
		for i := 0; i < len(word); i++ {
			c := word[i]
			if !(isAlnum(c) || c == '_' || c == '-') {
				return false
			}
		}
	}
	return true
}

func validSource(s string) bool {
	if len(s) == 0 || len(s) > 256 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] == 0x7f {
			return false
		}
	}
	return true
}

// ValidAggregateType reports whether s is an aggregate type: 1 to 64
// characters of [a-z0-9_-], starting with a letter.
func ValidAggregateType(s string) bool { return validAggregateType(s) }

// AggregateTypeRule is the rule ValidAggregateType checks, as errors quote it.
const AggregateTypeRule = ruleAggregateType

func validAggregateType(s string) bool {
	if len(s) == 0 || len(s) > 64 || s[0] < 'a' || s[0] > 'z' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func validSchemaVersion(s string) bool {
	if len(s) < 2 || len(s) > 16 || s[0] != 'v' {
		return false
	}
	for i := 1; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// validText: at most max bytes, no control characters (empty is fine).
func validText(s string, max int) bool {
	if len(s) > max {
		return false
	}
	for _, r := range s {
		if r < ' ' || r == 0x7f || r == 0xfffd {
			return false
		}
	}
	return true
}

func isAlnum(c byte) bool {
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
}
