// Package broker states, in this one file, everything relaybus asks of a
// message broker. Drivers implement it beside each other and import
// neither the other: shared/broker/pubsub (Google Cloud Pub/Sub, pstest,
// the gcloud emulator) and shared/broker/nats (NATS JetStream).
// shared/broker/brokertest is the conformance suite both pass.
//
// Every driver is a [Broker]: single publishes, a key's run published in
// order ([BatchPublisher]), provisioning a topology, and pulling messages
// under a lease. What only some brokers can do (seek a subscription to a
// time, keep snapshots, detach a push endpoint to pause delivery) is a
// capability: a small interface below that a caller asks for with [As],
// never by a type assertion on a driver's concrete type, and answers
// "not available on this broker" when the broker has not got it.
//
// The engines declare the one method they use themselves (event.Publisher,
// relay.Publisher); this package is where the whole contract, and the
// only union of it, is written.
package broker

import (
	"context"
	"errors"
	"reflect"
	"time"

	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/topology"
)

// Broker is what every driver does: what publish, relay and consume need.
type Broker interface {
	Publisher
	BatchPublisher
	Puller
	Provisioner
	// Close flushes what was published and releases the connection.
	Close() error
}

// Publisher sends single messages: publish's fast path, dead letters,
// rollup notices, replays. The engines' view of it is event.Publisher.
type Publisher interface {
	// Publish sends m to topic (a topic id such as "shop.order.events")
	// and waits for the broker's answer: the message id it stored m under.
	// A failed publish never blocks later publishes of m's ordering key.
	Publish(ctx context.Context, topic string, m event.Message) (messageID string, err error)
}

// BatchPublisher sends an aggregate's run as one ordered batch: the
// relay's path (its view of it is relay.Publisher).
type BatchPublisher interface {
	// PublishBatch publishes msgs to topic in order and returns how many
	// the broker acknowledged: all of them, or the prefix before the first
	// failure, with its error. Messages that share an ordering key are
	// stored in their order in msgs.
	PublishBatch(ctx context.Context, topic string, msgs []event.Message) (int, error)
}

// Puller hands out a subscription's messages under a lease: consume's
// pull mode and the local stack's delivery loop (internal/pull's view of
// it is pull.Source).
type Puller interface {
	// Pull returns at most max messages of subscription, each leased to the
	// caller until it acknowledges it, hands it back or lets its lease
	// lapse. It waits for messages at most until ctx ends or the driver's
	// own poll wait passes, then returns none and no error. With ordering
	// on, a key's messages come in order.
	Pull(ctx context.Context, subscription string, max int) ([]Lease, error)
}

// Lease is one pulled message and its lease.
type Lease interface {
	// Message is the message as the engine reads it (Topic,
	// DeliveryAttempt and PublishTime filled when the broker knows them).
	Message() event.Message
	// Ack acknowledges the message: it is not delivered again.
	Ack(ctx context.Context) error
	// Nack hands the message back for redelivery after delay (0: as soon
	// as the broker will).
	Nack(ctx context.Context, delay time.Duration) error
	// Extend renews the lease for the subscription's ack deadline.
	Extend(ctx context.Context) error
}

// Provisioner creates what a topology declares, as Terraform does in
// production: every topic and its <topic>.dlq, the dead-letter monitor
// subscriptions, one ordered subscription per consumer and the rollup
// topic with its subscription.
type Provisioner interface {
	// Provision creates what is missing and leaves what exists alone.
	Provision(ctx context.Context, t *topology.Topology) error
}

// RollupSubscription is the id of the subscription rollup reads the rollup
// topic through, which Provision creates on every broker.
func RollupSubscription(t *topology.Topology) string {
	return t.Rollup.Topic + ".rollup-processor"
}

// TimeSeeker is a capability: rewinding a subscription to a time, so that
// every message the broker retained from t on is delivered again,
// acknowledged or not (Pub/Sub's Seek; JetStream by recreating the
// durable consumer). Both drivers have it.
type TimeSeeker interface {
	SeekTime(ctx context.Context, subscription string, t time.Time) error
}

// Snapshotter is a capability: named snapshots of a subscription's
// acknowledgement state, and seeking a subscription back to one (Pub/Sub
// only).
type Snapshotter interface {
	// CreateSnapshot takes a snapshot named name of subscription.
	CreateSnapshot(ctx context.Context, name, subscription string) (Snapshot, error)
	// Snapshots lists the project's snapshots.
	Snapshots(ctx context.Context) ([]Snapshot, error)
	// SeekSnapshot rewinds subscription to the snapshot named snapshot.
	SeekSnapshot(ctx context.Context, subscription, snapshot string) error
}

// Snapshot is a snapshot as a Snapshotter reports it.
type Snapshot struct {
	// Name is the snapshot's id, Topic the id of its subscription's topic.
	Name, Topic string
	// Expires is when the broker deletes it (zero: unknown).
	Expires time.Time
}

// PushConfigurer is a capability: reading and setting where a push
// subscription delivers (Pub/Sub only). An empty PushEndpoint means the
// broker pushes nothing and messages wait in the subscription, in order:
// that is how dlqreplay pauses a push consumer.
type PushConfigurer interface {
	// PushEndpoint returns where subscription pushes (empty: nowhere).
	PushEndpoint(ctx context.Context, subscription string) (PushEndpoint, error)
	// SetPushEndpoint sets it; it reports whether anything changed.
	SetPushEndpoint(ctx context.Context, subscription string, e PushEndpoint) (changed bool, err error)
}

// PushEndpoint is where a push subscription delivers and the OIDC
// identity its pushes carry. The zero value is "no endpoint".
type PushEndpoint struct {
	URL, ServiceAccount, Audience string
}

// SubscriptionAdmin is a capability: a consumer's own subscription
// created and deleted at run time, without the deploy that provisions the
// topology's (the operators' API's forwarders). Both drivers have it; a
// JetStream durable consumer takes no Filter nor Push (ErrRefused).
type SubscriptionAdmin interface {
	// CreateSubscription creates s (ErrExists when a subscription of its
	// name exists; ErrRefused when the broker refuses a setting, a filter
	// it cannot parse say).
	CreateSubscription(ctx context.Context, s SubscriptionSpec) error
	// DeleteSubscription deletes subscription and what it holds
	// (ErrNotFound when there is none).
	DeleteSubscription(ctx context.Context, subscription string) error
}

// SubscriptionSpec is a subscription as SubscriptionAdmin creates it.
type SubscriptionSpec struct {
	// Name and Topic are the subscription's and its topic's ids.
	Name, Topic string
	// Filter is the broker's filter on the messages' attributes (empty:
	// every message).
	Filter string
	// Ordered delivers each ordering key's messages in order.
	Ordered bool
	// AckDeadline is how long a delivery may take before it is redelivered.
	AckDeadline time.Duration
	// MinBackoff and MaxBackoff space the redeliveries of a refused message.
	MinBackoff, MaxBackoff time.Duration
	// DeadLetterTopic, when set, receives a message refused
	// MaxDeliveryAttempts times.
	DeadLetterTopic     string
	MaxDeliveryAttempts int
	// Retention keeps acknowledged messages that long, for seeks (0: none).
	Retention time.Duration
	// Push, when set, is where the broker pushes each message, with that
	// OIDC identity (zero: a pull subscription).
	Push PushEndpoint
}

// Errors of the capabilities' administration calls (the Kind of an
// *Error), so callers answer them with errors.Is whatever the broker.
var (
	// ErrNotFound: the subscription or snapshot does not exist.
	ErrNotFound = errors.New("broker: not found")
	// ErrExists: a snapshot of that name exists.
	ErrExists = errors.New("broker: already exists")
	// ErrRefused: the broker refused the request as given (a time its
	// retention cannot reach, a snapshot of another topic).
	ErrRefused = errors.New("broker: refused")
	// ErrPermissionDenied: the caller's identity may not do that.
	ErrPermissionDenied = errors.New("broker: permission denied")
)

// Error is an administration call the broker refused: errors.Is matches
// its Kind (one of the sentinels above) and the broker's own error.
type Error struct {
	// Kind is ErrNotFound, ErrExists, ErrRefused or ErrPermissionDenied.
	Kind error
	// Reason is the broker's own words: what to change.
	Reason string
	// Err is the driver's error.
	Err error
}

// Error returns the broker's reason.
func (e *Error) Error() string { return e.Reason }

// Unwrap returns Kind and Err, for errors.Is and errors.As.
func (e *Error) Unwrap() []error { return []error{e.Kind, e.Err} }

// Unwrapper is implemented by a broker that wraps another (a decorator
// adding tracing or counting, say), so that As finds the capabilities of
// the broker underneath.
type Unwrapper interface {
	Unwrap() Broker
}

// As asks b for the capability T (TimeSeeker, Snapshotter,
// PushConfigurer, or any other interface): it returns b as a T when b has
// it, else the broker b wraps (Unwrapper) when that one has it, and false
// when none has. It is the one way callers learn what a broker can do.
//
// A nil broker, or a nil pointer in a Broker interface, has no capability
// (As never returns a T whose methods would dereference nil), and As looks
// at most 16 wrappers deep (maxWraps), so a wrapper that unwraps to itself ends
// the search instead of looping.
func As[T any](b any) (T, bool) {
	for range maxWraps + 1 {
		if isNil(b) {
			break
		}
		if c, ok := b.(T); ok {
			return c, true
		}
		w, ok := b.(Unwrapper)
		if !ok {
			break
		}
		b = w.Unwrap()
	}
	var zero T
	return zero, false
}

// maxWraps is how many wrappers deep As looks for a capability.
const maxWraps = 16

// isNil says whether b is nil or holds a nil pointer, map, channel,
// function or slice.
func isNil(b any) bool {
	if b == nil {
		return true
	}
	switch v := reflect.ValueOf(b); v.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Chan, reflect.Func, reflect.Slice, reflect.Interface:
		return v.IsNil()
	}
	return false
}
