package model

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/relaybus/relaybus/shared/event"
)

// Status is an event's status in the ledger (docs/ledger.md "Statuses").
type Status string

// The statuses. See internal/ledger's package documentation for when each holds.
const (
	StatusPending  Status = "PENDING"
	StatusSent     Status = "SENT"
	StatusConsumed Status = "CONSUMED"
	StatusPartial  Status = "PARTIAL"
	StatusFailed   Status = "FAILED"
	StatusRetrying Status = "RETRYING"
	StatusExpired  Status = "EXPIRED"
)

// Statuses lists every status, for validation and documentation.
var Statuses = []Status{StatusPending, StatusSent, StatusConsumed, StatusPartial, StatusFailed, StatusRetrying, StatusExpired}

// ParseStatus reads a status name (any case).
func ParseStatus(s string) (Status, error) {
	st := Status(strings.ToUpper(strings.TrimSpace(s)))
	for _, v := range Statuses {
		if st == v {
			return st, nil
		}
	}
	return "", fmt.Errorf("unknown status %q: want one of PENDING, SENT, CONSUMED, PARTIAL, FAILED, RETRYING, EXPIRED", s)
}

// Outcome classifies one consumption attempt, following the consume error
// taxonomy.
type Outcome string

// Attempt outcomes.
const (
	// OutcomeSuccess: the handler committed (or the event was a duplicate the
	// inbox had already applied).
	OutcomeSuccess Outcome = "success"
	// OutcomeRetry: a transient failure; consume answered non-2xx and
	// Pub/Sub will redeliver.
	OutcomeRetry Outcome = "retry"
	// OutcomeFailed: a permanent business error; acknowledged, not retried.
	OutcomeFailed Outcome = "failed"
	// OutcomePoison: the message can never be handled (undecodable, no valid
	// aggregate id, unknown schema version); acknowledged and sent to the DLQ.
	OutcomePoison Outcome = "poison"
	// OutcomeDeadLettered: Pub/Sub gave up after the subscription's maximum
	// delivery attempts and moved the message to the DLQ.
	OutcomeDeadLettered Outcome = "dead_lettered"
	// OutcomeParked: a strict consumer received the event before its
	// predecessor and parked it in its own database (acknowledged, not
	// applied). When the missing version is applied, the event is applied in
	// the same transaction and gets a success attempt of its own.
	OutcomeParked Outcome = "parked"
	// OutcomeStalled: a parked event's gap (the missing predecessor) stayed
	// open longer than the consumer's gap timeout. It is still parked; it is
	// applied when the missing version arrives (a replay, a re-push) or an
	// operator skips that version (consume's POST /gaps:skip).
	OutcomeStalled Outcome = "stalled"
)

// Final reports whether nothing will retry the attempt automatically: not
// retry (Pub/Sub redelivers) and not parked (the consumer applies it when
// its predecessor arrives).
func (o Outcome) Final() bool { return o != OutcomeRetry && o != OutcomeParked }

// Attempt is one consumption attempt of one event by one consumer: a
// document of the insert-only event_consumptions collection (group): the
// subcollection of the event's document.
type Attempt struct {
	EventID    string `firestore:"eventId" json:"eventId"`
	ConsumerID string `firestore:"consumerId" json:"consumerId"`
	// AttemptNo counts the consumer's attempts at the event from 1, across
	// redeliveries, re-pushes and replays.
	AttemptNo int     `firestore:"attemptNo" json:"attemptNo"`
	Success   bool    `firestore:"success" json:"success"`
	Outcome   Outcome `firestore:"outcome" json:"outcome"`
	// ErrorCode is a short machine-readable code: the handler's business
	// code, or the engine's (gap, timeout, malformed, ...).
	ErrorCode    string    `firestore:"errorCode,omitempty" json:"errorCode,omitempty"`
	ErrorMessage string    `firestore:"errorMessage,omitempty" json:"errorMessage,omitempty"`
	ConsumedAt   time.Time `firestore:"consumedAt" json:"consumedAt"`
	CreatedAt    time.Time `firestore:"createdAt" json:"createdAt"`
	// DeleteAt is when Firestore's TTL policy deletes the attempt (see
	// Event.DeleteAt).
	DeleteAt time.Time `firestore:"deleteAt,omitempty" json:"-"`
	// Delivery facts, for tracing an attempt back to Pub/Sub.
	Topic           string `firestore:"topic,omitempty" json:"topic,omitempty"`
	Subscription    string `firestore:"subscription,omitempty" json:"subscription,omitempty"`
	MessageID       string `firestore:"messageId,omitempty" json:"messageId,omitempty"`
	DeliveryAttempt int    `firestore:"deliveryAttempt,omitempty" json:"deliveryAttempt,omitempty"`
}

// Collection names.
const (
	CollectionEvents       = "events"
	CollectionConsumers    = "topic_consumers"
	CollectionConsumptions = "event_consumptions"
	CollectionDeadLetters  = "dead_letters"
)

// AttemptDocID is the deterministic id of an attempt's document (in its
// event's event_consumptions subcollection), so that a retried write of the
// same attempt changes nothing. It starts with the event's document id
// ([EventDocID]), which keeps it unique across the collection group.
func AttemptDocID(eventID, consumerID string, attemptNo int) string {
	return EventDocID(eventID) + "~" + consumerID + "~" + fmt.Sprintf("%06d", attemptNo)
}

// ConsumerDocID is the id of a topic_consumers document: unique per topic
// and consumer.
func ConsumerDocID(topic, consumerID string) string { return topic + "~" + consumerID }

// MaxNoticeEvents is the most event ids one rollup notice carries.
const MaxNoticeEvents = 500

// RollupMessage is the notice consume publishes to the rollup topic after it
// records attempts: the events' ids as JSON data ({"eventIds": [...]}), and
// for a single event also as its event_id attribute ({"eventId": ...} is
// read too).
func RollupMessage(eventIDs ...string) event.Message {
	m := event.Message{Attributes: map[string]string{event.AttrContentType: "application/json"}}
	if len(eventIDs) == 1 {
		m.Attributes[event.AttrEventID] = eventIDs[0]
	}
	m.Data, _ = json.Marshal(map[string][]string{"eventIds": eventIDs})
	return m
}

// Notice is what the rollup notices gathered for one event say: the
// attempts they carried (folded into the event's document by
// ledger.Store.Fold), and whether a notice named the event without its attempts
// (Legacy: the attempts are documents the rollup reads, as notices
// published before the fold had it).
type Notice struct {
	EventID  string
	Attempts []Attempt
	Legacy   bool
}

// noticeAttempt is an attempt as a rollup notice carries it: what the
// event's document folds in (AttemptMark) and whose it is.
type noticeAttempt struct {
	EventID         string    `json:"e"`
	ConsumerID      string    `json:"c"`
	AttemptNo       int       `json:"n"`
	Outcome         Outcome   `json:"o"`
	ConsumedAt      time.Time `json:"t"`
	ErrorCode       string    `json:"ec,omitempty"`
	ErrorMessage    string    `json:"em,omitempty"`
	Topic           string    `json:"tp,omitempty"`
	Subscription    string    `json:"s,omitempty"`
	MessageID       string    `json:"m,omitempty"`
	DeliveryAttempt int       `json:"d,omitempty"`
}

// MaxNoticeAttempts is the most attempts one rollup notice carries.
const MaxNoticeAttempts = 500

// FoldMessage is the rollup notice of a batch of attempts (at most
// MaxNoticeAttempts): their events' ids, as in RollupMessage, and the
// attempts themselves ({"eventIds": [...], "attempts": [...]}), so the
// rollup folds each consumer's outcome into its event's document without
// reading an attempt back, and writes the ones its topic's level keeps as
// documents of their own (with their error messages, which notices carry
// for that, cut to MaxErrorText: at most 2 MiB in a notice of 500 failed
// attempts, under Pub/Sub's 10 MB).
func FoldMessage(as []Attempt) event.Message {
	var ids []string
	seen := map[string]bool{}
	body := struct {
		EventIDs []string        `json:"eventIds"`
		Attempts []noticeAttempt `json:"attempts"`
	}{Attempts: make([]noticeAttempt, 0, len(as))}
	for _, a := range as {
		if !seen[a.EventID] {
			seen[a.EventID] = true
			ids = append(ids, a.EventID)
		}
		body.Attempts = append(body.Attempts, noticeAttempt{EventID: a.EventID, ConsumerID: a.ConsumerID, AttemptNo: a.AttemptNo,
			Outcome: a.Outcome, ConsumedAt: a.ConsumedAt.UTC(), ErrorCode: a.ErrorCode, ErrorMessage: Truncate(a.ErrorMessage, MaxErrorText), Topic: a.Topic,
			Subscription: a.Subscription, MessageID: a.MessageID, DeliveryAttempt: a.DeliveryAttempt})
	}
	body.EventIDs = ids
	m := event.Message{Attributes: map[string]string{event.AttrContentType: "application/json"}}
	if len(ids) == 1 {
		m.Attributes[event.AttrEventID] = ids[0]
	}
	m.Data, _ = json.Marshal(body)
	return m
}

// ReadNotice reads a rollup notice (RollupMessage or FoldMessage): one
// Notice per event it names, in the order named, each attempt checked
// (Attempt.Validate; a notice with a bad one is refused whole, naming it).
func ReadNotice(m event.Message) ([]Notice, error) {
	ids, err := RollupEventIDs(m)
	if err != nil {
		return nil, err
	}
	var body struct {
		Attempts []noticeAttempt `json:"attempts"`
	}
	_ = json.Unmarshal(m.Data, &body)
	if len(body.Attempts) > MaxNoticeAttempts {
		return nil, fmt.Errorf("rollup notice carries more than %d attempts", MaxNoticeAttempts)
	}
	at := make(map[string]int, len(ids))
	out := make([]Notice, len(ids))
	for i, id := range ids {
		at[id] = i
		out[i] = Notice{EventID: id}
	}
	for _, na := range body.Attempts {
		a := Attempt{EventID: strings.TrimSpace(na.EventID), ConsumerID: na.ConsumerID, AttemptNo: na.AttemptNo,
			Success: na.Outcome == OutcomeSuccess, Outcome: na.Outcome, ConsumedAt: na.ConsumedAt, ErrorCode: na.ErrorCode, ErrorMessage: na.ErrorMessage,
			Topic: na.Topic, Subscription: na.Subscription, MessageID: na.MessageID, DeliveryAttempt: na.DeliveryAttempt}
		if err := a.Validate(); err != nil {
			return nil, fmt.Errorf("rollup notice: attempt %d of %s by %s: %w", na.AttemptNo, na.EventID, na.ConsumerID, err)
		}
		i, ok := at[a.EventID]
		if !ok {
			return nil, fmt.Errorf("rollup notice: attempt of %s, an event it does not name", a.EventID)
		}
		out[i].Attempts = append(out[i].Attempts, a)
	}
	for i := range out {
		out[i].Legacy = len(out[i].Attempts) == 0
	}
	return out, nil
}

// ErrNoEventID means a rollup notice named no event.
var ErrNoEventID = errors.New("rollup notice names no event id")

// RollupEventIDs reads the event ids out of a rollup notice (at most
// MaxNoticeEvents, each trimmed, repeats dropped).
func RollupEventIDs(m event.Message) ([]string, error) {
	var body struct {
		EventID  string   `json:"eventId"`
		EventIDs []string `json:"eventIds"`
	}
	_ = json.Unmarshal(m.Data, &body)
	ids := append([]string{m.Attributes[event.AttrEventID], body.EventID}, body.EventIDs...)
	seen := map[string]bool{}
	var out []string
	for _, id := range ids {
		id = strings.TrimSpace(id)
		if id == "" || seen[id] {
			continue
		}
		if len(out) == MaxNoticeEvents {
			return nil, fmt.Errorf("rollup notice names more than %d events", MaxNoticeEvents)
		}
		seen[id] = true
		out = append(out, id)
	}
	if len(out) == 0 {
		return nil, ErrNoEventID
	}
	return out, nil
}

// ErrEventNotFound means the ledger holds no document for the event (yet).
var ErrEventNotFound = errors.New("event not in the ledger")

// Sends notices. A relay whose identity may not write the ledger
// (consume's kicker of its handlers' child events) hands its sends to the
// rollup through the rollup topic; the rollup records them
// (ledger.Store.RecordSent) as the relay's own recorder would.
const (
	// NoticeKindAttr names a rollup notice's kind; a notice without it
	// carries attempts (FoldMessage) or event ids (RollupMessage).
	NoticeKindAttr = "relaybus_notice"
	// NoticeSends is NoticeKindAttr's value on a sends notice.
	NoticeSends = "sends"
	// MaxSendsNoticeBytes bounds a sends notice's data, under Pub/Sub's
	// 10 MB message limit.
	MaxSendsNoticeBytes = 8 << 20
)

// noticeSend is a send as a sends notice carries it: the event with its
// payload, or its payload's size alone when the ledger would not keep it
// (over DefaultMaxStoredPayload).
type noticeSend struct {
	Event       *event.Event `json:"e"`
	EnqueuedAt  time.Time    `json:"q"`
	At          time.Time    `json:"t"`
	PayloadSize int          `json:"ps,omitempty"`
}

// SendsMessages returns the sends notices of sends: as many as keep each
// under MaxSendsNoticeBytes (one send per notice at least).
func SendsMessages(sends []Sent) ([]event.Message, error) {
	var out []event.Message
	var batch []json.RawMessage
	size := 0
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		data, err := json.Marshal(map[string]any{"sends": batch})
		if err != nil {
			return err
		}
		out = append(out, event.Message{Data: data, Attributes: map[string]string{event.AttrContentType: "application/json", NoticeKindAttr: NoticeSends}})
		batch, size = nil, 0
		return nil
	}
	for _, s := range sends {
		if s.Event == nil {
			continue
		}
		ns := noticeSend{Event: s.Event, EnqueuedAt: s.EnqueuedAt.UTC(), At: s.At.UTC()}
		if len(s.Event.Payload) > DefaultMaxStoredPayload {
			e := *s.Event
			e.Payload, ns.Event, ns.PayloadSize = nil, &e, len(s.Event.Payload)
		}
		b, err := json.Marshal(ns)
		if err != nil {
			return nil, fmt.Errorf("sends notice: %s: %w", s.Event.ID, err)
		}
		if size+len(b) > MaxSendsNoticeBytes {
			if err := flush(); err != nil {
				return nil, err
			}
		}
		batch, size = append(batch, b), size+len(b)+1
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return out, nil
}

// IsSendsNotice reports whether m is a sends notice.
func IsSendsNotice(m event.Message) bool { return m.Attributes[NoticeKindAttr] == NoticeSends }

// ReadSends reads a sends notice. A payload the notice left out comes back
// as its size (Sent.OmittedPayload), which the ledger records with the
// payload marked omitted.
func ReadSends(m event.Message) ([]Sent, error) {
	var body struct {
		Sends []noticeSend `json:"sends"`
	}
	if err := json.Unmarshal(m.Data, &body); err != nil {
		return nil, fmt.Errorf("sends notice: %w", err)
	}
	out := make([]Sent, 0, len(body.Sends))
	for i, ns := range body.Sends {
		if ns.Event == nil {
			return nil, fmt.Errorf("sends notice: send %d has no event", i)
		}
		if err := CheckEventID(ns.Event.ID); err != nil {
			return nil, fmt.Errorf("sends notice: send %d: %w", i, err)
		}
		snd := Sent{Event: ns.Event, EnqueuedAt: ns.EnqueuedAt, At: ns.At}
		if ns.PayloadSize > 0 && len(ns.Event.Payload) == 0 {
			snd.OmittedPayload = ns.PayloadSize
		}
		out = append(out, snd)
	}
	return out, nil
}
