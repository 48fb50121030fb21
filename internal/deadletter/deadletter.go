// Package deadletter is the contract of messages on a <topic>.dlq topic. Two
// writers put them there: Pub/Sub itself, when a subscription exhausts its
// maximum delivery attempts (it adds the CloudPubSubDeadLetter* attributes),
// and consume, when a message is poison and can never succeed (it adds the
// dead_letter_* attributes with the reason). Both keep the original data and
// attributes. dlqreplay reads either kind with [Read].
package deadletter

import (
	"strconv"
	"strings"
	"time"

	"github.com/relaybus/relaybus/internal/names"
	"github.com/relaybus/relaybus/shared/event"
)

// Attributes Pub/Sub adds to a message it dead-letters.
const (
	AttrSourceSubscription        = "CloudPubSubDeadLetterSourceSubscription"
	AttrSourceSubscriptionProject = "CloudPubSubDeadLetterSourceSubscriptionProject"
	AttrSourceTopicPublishTime    = "CloudPubSubDeadLetterSourceTopicPublishTime"
	AttrSourceDeliveryCount       = "CloudPubSubDeadLetterSourceDeliveryCount"
)

// Attributes consume adds to a poison message it dead-letters.
const (
	AttrReason       = "dead_letter_reason"
	AttrError        = "dead_letter_error"
	AttrConsumer     = "dead_letter_consumer"
	AttrSubscription = "dead_letter_subscription"
	AttrMessageID    = "dead_letter_message_id"
	AttrAt           = "dead_letter_at"
)

// ReasonMaxDeliveryAttempts is the reason of messages Pub/Sub dead-lettered.
const ReasonMaxDeliveryAttempts = "max_delivery_attempts"

// maxErrorLen bounds the error attribute (Pub/Sub allows 1024-byte values).
const maxErrorLen = 1000

// Poison returns the message consume publishes to the dead-letter topic for
// a poison delivery: orig's data, attributes and ordering key, plus why.
func Poison(orig event.Message, reason, errMsg, consumer, subscription string, at time.Time) event.Message {
	m := clone(orig)
	m.Attributes[AttrReason] = reason
	m.Attributes[AttrError] = truncate(errMsg, maxErrorLen)
	m.Attributes[AttrConsumer] = consumer
	m.Attributes[AttrSubscription] = names.ResourceID(subscription)
	if orig.ID != "" {
		m.Attributes[AttrMessageID] = orig.ID
	}
	m.Attributes[AttrAt] = at.UTC().Format(time.RFC3339Nano)
	return m
}

// PubSub returns the message Pub/Sub publishes to the dead-letter topic when
// subscription (of project) gives up on orig after deliveries attempts. The
// local delivery loop uses it to dead-letter exactly as Pub/Sub does.
func PubSub(orig event.Message, project, subscription string, deliveries int) event.Message {
	m := clone(orig)
	m.Attributes[AttrSourceSubscription] = names.ResourceID(subscription)
	m.Attributes[AttrSourceSubscriptionProject] = project
	m.Attributes[AttrSourceDeliveryCount] = strconv.Itoa(deliveries)
	if !orig.PublishTime.IsZero() {
		m.Attributes[AttrSourceTopicPublishTime] = orig.PublishTime.UTC().Format(time.RFC3339Nano)
	}
	return m
}

// Info is what a dead letter says about itself.
type Info struct {
	// Subscription is the id of the subscription the message failed on.
	Subscription string
	// Consumer is the consumer service that failed it.
	Consumer string
	// Reason is a poison reason (event.Reason*, "unknown_schema_version", ...)
	// or ReasonMaxDeliveryAttempts.
	Reason string
	// Error is the consumer's error message, when it gave one.
	Error string
	// Deliveries is Pub/Sub's delivery count (0 for poison).
	Deliveries int
	// SourceMessageID is the id the message had on its original topic, when known.
	SourceMessageID string
	// DeadLetteredAt is when it was dead-lettered, when known.
	DeadLetteredAt time.Time
}

// Read returns what m's attributes say about its dead-lettering.
func Read(m event.Message) Info {
	a := m.Attributes
	in := Info{
		Subscription:    names.ResourceID(first(a[AttrSubscription], a[AttrSourceSubscription])),
		Consumer:        a[AttrConsumer],
		Reason:          a[AttrReason],
		Error:           a[AttrError],
		SourceMessageID: a[AttrMessageID],
	}
	in.Deliveries, _ = strconv.Atoi(a[AttrSourceDeliveryCount])
	if in.Reason == "" && a[AttrSourceSubscription] != "" {
		in.Reason = ReasonMaxDeliveryAttempts
	}
	if in.Consumer == "" {
		if _, consumer, _, err := names.ParseSubscription(in.Subscription); err == nil {
			in.Consumer = consumer
		}
	}
	if t, err := time.Parse(time.RFC3339Nano, a[AttrAt]); err == nil {
		in.DeadLetteredAt = t
	}
	return in
}

// Original returns the message as it was before dead-lettering: the
// dead-letter attributes removed.
func Original(m event.Message) event.Message {
	o := clone(m)
	for k := range o.Attributes {
		if strings.HasPrefix(k, "CloudPubSubDeadLetter") || strings.HasPrefix(k, "dead_letter_") {
			delete(o.Attributes, k)
		}
	}
	return o
}

func clone(m event.Message) event.Message {
	c := m
	c.Attributes = make(map[string]string, len(m.Attributes)+6)
	for k, v := range m.Attributes {
		c.Attributes[k] = v
	}
	c.ID, c.PublishTime, c.DeliveryAttempt = "", time.Time{}, 0
	return c
}

func first(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && s[cut]&0xc0 == 0x80 { // do not split a UTF-8 sequence
		cut--
	}
	return s[:cut] + "…"
}
