package ledger

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/relaybus/relaybus/shared/event"
)

// Status is an event's status in the ledger (event-ledger-design.md §2.4).
type Status string

// The statuses. See the package documentation for when each holds.
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
)

// Final reports whether nothing will retry the attempt automatically.
func (o Outcome) Final() bool { return o != OutcomeRetry }

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

// RollupMessage is the notice consume publishes to the rollup topic after it
// records an attempt: the event id, as an attribute and as JSON data.
func RollupMessage(eventID string) event.Message {
	data, _ := json.Marshal(map[string]string{"eventId": eventID})
	return event.Message{Data: data, Attributes: map[string]string{event.AttrEventID: eventID, event.AttrContentType: "application/json"}}
}

// ErrNoEventID means a rollup notice named no event.
var ErrNoEventID = errors.New("rollup notice names no event id")

// RollupEventID reads the event id out of a rollup notice.
func RollupEventID(m event.Message) (string, error) {
	if id := strings.TrimSpace(m.Attributes[event.AttrEventID]); id != "" {
		return id, nil
	}
	var body struct {
		EventID string `json:"eventId"`
	}
	if err := json.Unmarshal(m.Data, &body); err == nil && strings.TrimSpace(body.EventID) != "" {
		return strings.TrimSpace(body.EventID), nil
	}
	return "", ErrNoEventID
}
