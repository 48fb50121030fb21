package model

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/relaybus/relaybus/internal/names"
	"github.com/relaybus/relaybus/shared/event"
)

// Event is an event's document in the events collection: the envelope as the
// producer wrote it (docs/architecture.md "The event"), the send state, the
// status, and the consumers the event was sent to.
type Event struct {
	EventID       string    `firestore:"eventId" json:"eventId"`
	EventType     string    `firestore:"eventType" json:"eventType"`
	Source        string    `firestore:"source" json:"source"`
	Topic         string    `firestore:"topic" json:"topic"`
	AggregateType string    `firestore:"aggregateType" json:"aggregateType"`
	AggregateID   string    `firestore:"aggregateId" json:"aggregateId"`
	Version       int64     `firestore:"version" json:"version"`
	OccurredAt    time.Time `firestore:"occurredAt" json:"occurredAt"`
	SchemaVersion string    `firestore:"schemaVersion" json:"schemaVersion"`
	PayloadType   string    `firestore:"payloadType" json:"payloadType"`
	// Payload is the payload as produced, unless it was larger than the
	// store's MaxStoredPayload (then PayloadOmitted is true; the outbox and
	// Pub/Sub hold it). List and trace queries do not read it.
	Payload        []byte    `firestore:"payload,omitempty" json:"payload,omitempty"`
	PayloadSize    int       `firestore:"payloadSize" json:"payloadSize"`
	PayloadOmitted bool      `firestore:"payloadOmitted,omitempty" json:"payloadOmitted,omitempty"`
	TraceID        string    `firestore:"traceId,omitempty" json:"traceId,omitempty"`
	SpanID         string    `firestore:"spanId,omitempty" json:"spanId,omitempty"`
	ParentEventID  string    `firestore:"parentEventId,omitempty" json:"parentEventId,omitempty"`
	CorrelationID  string    `firestore:"correlationId,omitempty" json:"correlationId,omitempty"`
	SourceVersion  string    `firestore:"sourceVersion,omitempty" json:"sourceVersion,omitempty"`
	Initiator      Initiator `firestore:"initiator" json:"initiator"`
	ExpireAt       time.Time `firestore:"expireAt,omitempty" json:"expireAt,omitzero"`

	// Privacy (internal/privacy): RedactedFields are the JSON pointers of
	// the personal fields the topic's rule hashed or removed from Payload;
	// PayloadWithheld is true when the rule kept none of it; PayloadErased
	// is true once the subject's payloads were erased (ErasedAt when).
	// SubjectKey is the data subject's keyed hash (privacy.Key.SubjectKey),
	// what erasure finds the subject's events by; never shown.
	RedactedFields  []string  `firestore:"redactedFields,omitempty" json:"redactedFields,omitempty"`
	PayloadWithheld bool      `firestore:"payloadWithheld,omitempty" json:"payloadWithheld,omitempty"`
	PayloadErased   bool      `firestore:"payloadErased,omitempty" json:"payloadErased,omitempty"`
	ErasedAt        time.Time `firestore:"erasedAt,omitempty" json:"erasedAt,omitzero"`
	SubjectKey      string    `firestore:"subjectKey,omitempty" json:"-"`

	// Status is the event's status; see internal/ledger's package documentation.
	Status Status `firestore:"status" json:"status"`
	// StatusAt is when Status last changed.
	StatusAt time.Time `firestore:"statusAt" json:"statusAt"`
	// RetryCount counts re-pushes (0 after the first send).
	RetryCount int `firestore:"retryCount" json:"retryCount"`
	// SentAt is when the relay first handed the event to Pub/Sub; zero while
	// it never was.
	SentAt time.Time `firestore:"sentAt,omitempty" json:"sentAt,omitzero"`
	// LastSentAt is the latest send, re-pushes included.
	LastSentAt time.Time `firestore:"lastSentAt,omitempty" json:"lastSentAt,omitzero"`
	// EnqueuedAt is when the producer's transaction committed the event to
	// the outbox (zero when the relay did not say).
	EnqueuedAt time.Time `firestore:"enqueuedAt,omitempty" json:"enqueuedAt,omitzero"`
	CreatedAt  time.Time `firestore:"createdAt" json:"createdAt"`
	UpdatedAt  time.Time `firestore:"updatedAt" json:"updatedAt"`
	// ExpectedConsumers are the consumers (topic_consumers, enabled) of the
	// topic when the event was sent, in sort order. The event keeps this
	// list whatever the registry says later.
	ExpectedConsumers []string `firestore:"expectedConsumers" json:"expectedConsumers"`

	// Shard is the event id's hash modulo the shard count of the store that
	// created the document: the first field of the time-ordered indexes
	// (see DefaultShards).
	Shard int `firestore:"shard" json:"-"`
	// ExpireDue equals ExpireAt while the event is open (not CONSUMED or
	// EXPIRED) and is absent otherwise, so the expiry sweep's index holds
	// only events it may still have to expire.
	ExpireDue time.Time `firestore:"expireDue,omitempty" json:"-"`
	// Repush is the latest operator re-push, nil when there was none.
	Repush *Repush `firestore:"repush,omitempty" json:"repush,omitempty"`
	// PublishFailure is the relay's latest failure to publish the event, nil
	// when there was none.
	PublishFailure *PublishFailure `firestore:"publishFailure,omitempty" json:"publishFailure,omitempty"`
	// CheckAt is when the reconciler derives the status again if nothing
	// else has made it final by then; present while the status may still
	// move on its own (Status.Settled is false), absent otherwise, so the
	// reconciler's index holds only events it may have to look at.
	CheckAt time.Time `firestore:"checkAt,omitempty" json:"-"`
	// DeleteAt is when Firestore's TTL policy deletes the document (created
	// at + the store's Retention); absent when the store keeps documents.
	DeleteAt time.Time `firestore:"deleteAt,omitempty" json:"-"`
	// Folded is set on documents written since the fold: their consumers'
	// outcomes reach them in rollup notices (ledger.Store.Fold). A document
	// without it was written before; its attempts are all documents, and
	// a fold reads the ones its marks do not record.
	Folded bool `firestore:"folded,omitempty" json:"-"`
	// Latest holds, per consumer, the latest attempt the last rollup read.
	// A rollup reads only the attempts numbered after it, by their
	// document ids (see RollupMany), instead of querying the event's whole
	// event_consumptions subcollection.
	Latest map[string]AttemptMark `firestore:"latest,omitempty" json:"-"`
}

// AttemptMark is a consumer's latest attempt as the event's document
// keeps it (Event.Latest): what the status derivation needs, and the
// delivery facts, so that an attempt that is not kept as a document of its
// own (a consumer's first attempt that succeeded, at ledger level
// failures: see Level) can still be shown as the attempt it was. Marks
// written before the fold carry only the first three fields; their
// attempts are all documents.
type AttemptMark struct {
	AttemptNo       int       `firestore:"attemptNo"`
	Success         bool      `firestore:"success"`
	Outcome         Outcome   `firestore:"outcome"`
	ConsumedAt      time.Time `firestore:"consumedAt,omitempty"`
	ErrorCode       string    `firestore:"errorCode,omitempty"`
	Subscription    string    `firestore:"subscription,omitempty"`
	MessageID       string    `firestore:"messageId,omitempty"`
	DeliveryAttempt int       `firestore:"deliveryAttempt,omitempty"`
}

// Mark returns the attempt's AttemptMark.
func (a *Attempt) Mark() AttemptMark {
	return AttemptMark{AttemptNo: a.AttemptNo, Success: a.Success, Outcome: a.Outcome, ConsumedAt: a.ConsumedAt.UTC(),
		ErrorCode: a.ErrorCode, Subscription: a.Subscription, MessageID: a.MessageID, DeliveryAttempt: a.DeliveryAttempt}
}

// SameAttempt reports whether two marks are of the same attempt with the
// same outcome (marks of one attempt may differ in the delivery facts an
// older mark did not keep).
func (m AttemptMark) SameAttempt(o AttemptMark) bool {
	return m.AttemptNo == o.AttemptNo && m.Success == o.Success && m.Outcome == o.Outcome
}

// Attempt rebuilds the attempt a mark stands for.
func (m AttemptMark) Attempt(d *Event, consumerID string) Attempt {
	return Attempt{EventID: d.EventID, ConsumerID: consumerID, AttemptNo: m.AttemptNo, Success: m.Success, Outcome: m.Outcome,
		ErrorCode: m.ErrorCode, ConsumedAt: m.ConsumedAt, CreatedAt: m.ConsumedAt, Topic: d.Topic,
		Subscription: m.Subscription, MessageID: m.MessageID, DeliveryAttempt: m.DeliveryAttempt}
}

// Sent is one send for RecordSent: the event, when its producer's
// transaction committed it to the outbox, and when Pub/Sub acknowledged it.
type Sent struct {
	Event      *event.Event
	EnqueuedAt time.Time
	At         time.Time
	// OmittedPayload is the size of the event's payload when a sends
	// notice left it out (the ledger would not keep it: over
	// DefaultMaxStoredPayload); the event then has no payload.
	OmittedPayload int
}

// Initiator says who caused an event: a service, an operation, a user, a
// request (docs/architecture.md "The event").
type Initiator struct {
	Service         string `firestore:"service,omitempty" json:"service,omitempty"`
	Operation       string `firestore:"operation,omitempty" json:"operation,omitempty"`
	UserID          string `firestore:"userId,omitempty" json:"userId,omitempty"`
	ClientRequestID string `firestore:"clientRequestId,omitempty" json:"clientRequestId,omitempty"`
}

// Repush records an operator's re-push of an event (BeginRepush).
type Repush struct {
	At time.Time `firestore:"at" json:"at"`
	// Consumer is the consumer the re-push addressed; empty means every
	// subscriber of the topic.
	Consumer string `firestore:"consumer,omitempty" json:"consumer,omitempty"`
	// Since holds, for each addressed expected consumer, the highest
	// attempt number it had reached when the re-push began. An attempt
	// numbered higher answers the re-push.
	Since []ConsumerMark `firestore:"since" json:"since"`
	// PublishFailed is set when the relay gave up publishing the re-push:
	// it will not arrive, so it no longer holds the status at RETRYING.
	PublishFailed bool `firestore:"publishFailed,omitempty" json:"publishFailed,omitempty"`
}

// ConsumerMark is a consumer's attempt number at some moment.
type ConsumerMark struct {
	ConsumerID string `firestore:"consumerId" json:"consumerId"`
	AttemptNo  int    `firestore:"attemptNo" json:"attemptNo"`
}

// PublishFailure is the relay's latest failure to publish an event.
type PublishFailure struct {
	// Attempts is how many times the relay has tried.
	Attempts  int       `firestore:"attempts" json:"attempts"`
	LastError string    `firestore:"lastError" json:"lastError"`
	At        time.Time `firestore:"at" json:"at"`
	// Final is true when the relay gave up (the outbox row is failed).
	Final bool `firestore:"final" json:"final"`
}

// DefaultMaxStoredPayload is the largest payload the ledger keeps in an
// event's document. Firestore documents hold at most 1 MiB; the rest of the
// envelope is small.
const DefaultMaxStoredPayload = 900 << 10

// MaxErrorText bounds error messages kept in the ledger.
const MaxErrorText = 4096

// NewEvent builds the document of a sent (or failed) event from its
// envelope, spread over shards index shards.
func NewEvent(e *event.Event, maxPayload, shards int) Event {
	d := Event{
		EventID:       e.ID,
		EventType:     e.Type,
		Source:        e.Source,
		Topic:         e.Topic,
		AggregateType: e.AggregateType,
		AggregateID:   e.AggregateID,
		Version:       e.Version,
		OccurredAt:    e.OccurredAt.UTC(),
		SchemaVersion: e.SchemaVersion,
		PayloadType:   e.PayloadType,
		PayloadSize:   len(e.Payload),
		TraceID:       e.TraceID,
		SpanID:        e.SpanID,
		ParentEventID: e.ParentEventID,
		CorrelationID: e.CorrelationID,
		SourceVersion: e.SourceVersion,
		Initiator: Initiator{
			Service:         e.Initiator.Service,
			Operation:       e.Initiator.Operation,
			UserID:          e.Initiator.UserID,
			ClientRequestID: e.Initiator.ClientRequestID,
		},
		Shard:             shardOf(e.ID, shards),
		Folded:            true,
		ExpectedConsumers: []string{},
	}
	if len(e.Payload) <= maxPayload {
		d.Payload = e.Payload
	} else {
		d.PayloadOmitted = true
	}
	if !e.ExpireAt.IsZero() {
		d.ExpireAt = e.ExpireAt.UTC()
		d.ExpireDue = d.ExpireAt
	}
	return d
}

// StubEvent is the document a fold creates for an event whose send is not
// recorded yet (the relay records sends in the background and may lag
// behind its consumers): the event's id, topic and shard, and the
// consumers expected of the topic now; no envelope and no sentAt, which
// the send adds when it is recorded (ledger.Store.RecordSent). Folded is
// set: the consumers' outcomes are in its Latest marks.
func StubEvent(eventID, topic string, expected []string, shards int) Event {
	if expected == nil {
		expected = []string{}
	}
	return Event{EventID: eventID, Topic: topic, Shard: shardOf(eventID, shards), Folded: true, ExpectedConsumers: expected}
}

// ErrPayloadOmitted means the ledger did not keep an event's payload (it was
// over MaxStoredPayload), so the envelope cannot be rebuilt from the ledger.
var ErrPayloadOmitted = errors.New("the ledger did not keep this event's payload")

// Envelope rebuilds the event as produced, for a re-push whose outbox row
// retention has deleted. It fails with ErrPayloadOmitted when the ledger did
// not keep the payload.
func (d *Event) Envelope() (event.Event, error) {
	if d.PayloadOmitted {
		return event.Event{}, fmt.Errorf("event %s (%d bytes): %w", d.EventID, d.PayloadSize, ErrPayloadOmitted)
	}
	return event.Event{
		ID:            d.EventID,
		Type:          d.EventType,
		Source:        d.Source,
		Topic:         d.Topic,
		AggregateType: d.AggregateType,
		AggregateID:   d.AggregateID,
		Version:       d.Version,
		OccurredAt:    d.OccurredAt,
		SchemaVersion: d.SchemaVersion,
		PayloadType:   d.PayloadType,
		Payload:       d.Payload,
		TraceID:       d.TraceID,
		SpanID:        d.SpanID,
		ParentEventID: d.ParentEventID,
		CorrelationID: d.CorrelationID,
		SourceVersion: d.SourceVersion,
		Initiator: event.Initiator{
			Service:         d.Initiator.Service,
			Operation:       d.Initiator.Operation,
			UserID:          d.Initiator.UserID,
			ClientRequestID: d.Initiator.ClientRequestID,
		},
		ExpireAt: d.ExpireAt,
	}, nil
}

// LogEvent returns the envelope fields logging.Event needs (no payload).
func (d *Event) LogEvent() *event.Event {
	return &event.Event{ID: d.EventID, Type: d.EventType, AggregateType: d.AggregateType, AggregateID: d.AggregateID, Version: d.Version, TraceID: d.TraceID}
}

// Valid reports whether o is one of the Outcome constants.
func (o Outcome) Valid() bool {
	switch o {
	case OutcomeSuccess, OutcomeRetry, OutcomeFailed, OutcomePoison, OutcomeDeadLettered, OutcomeParked, OutcomeStalled:
		return true
	}
	return false
}

// Validate checks an attempt before it is recorded and returns every broken
// rule joined (each a *event.FieldError naming the field).
func (a *Attempt) Validate() error {
	var errs []error
	add := func(field, rule string) { errs = append(errs, &event.FieldError{Field: field, Rule: rule}) }
	if err := CheckEventID(a.EventID); err != nil {
		errs = append(errs, err)
	}
	if err := names.ValidateConsumer(a.ConsumerID); err != nil {
		add("consumerId", names.ConsumerRule)
	}
	if a.AttemptNo < 1 {
		add("attemptNo", "required: an integer of at least 1 (got "+strconv.Itoa(a.AttemptNo)+")")
	}
	switch {
	case !a.Outcome.Valid():
		add("outcome", "one of success, retry, failed, poison, dead_lettered, parked, stalled")
	case a.Success != (a.Outcome == OutcomeSuccess):
		add("success", "must be true exactly when outcome is success")
	}
	if a.ConsumedAt.IsZero() {
		add("consumedAt", "required: when the attempt finished")
	}
	return errors.Join(errs...)
}

// Truncate cuts s to at most n bytes on a rune boundary, marking the cut.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "…(truncated)"
	cut := n - len(mark)
	for cut > 0 && s[cut]&0xC0 == 0x80 {
		cut--
	}
	return s[:cut] + mark
}

// SentAt returns the sends of events, all acknowledged by Pub/Sub at at
// (and committed to the outbox then too, for want of better).
func SentAt(at time.Time, events ...*event.Event) []Sent {
	out := make([]Sent, len(events))
	for i, e := range events {
		out[i] = Sent{Event: e, EnqueuedAt: at, At: at}
	}
	return out
}
