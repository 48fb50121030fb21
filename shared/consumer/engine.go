package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relaybus/relaybus/shared/deadletter"
	"github.com/relaybus/relaybus/shared/delivery"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/inbox"
	"github.com/relaybus/relaybus/shared/ledger"
	"github.com/relaybus/relaybus/shared/logging"
	"github.com/relaybus/relaybus/shared/names"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/topology"
)

// DB is what the engine needs of Postgres (a *pgxpool.Pool).
type DB interface {
	outbox.DBTX
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Ledger records attempts (shared/ledger's Recorder).
type Ledger interface {
	// RecordAttempt inserts the attempt (idempotent on consumer, event and
	// attempt number) and notifies the rollup.
	RecordAttempt(ctx context.Context, a ledger.Attempt) error
}

// Publisher publishes dead letters (a *transport.Client).
type Publisher interface {
	Publish(ctx context.Context, topic string, m event.Message) (string, error)
}

// Defaults of Options.
const (
	DefaultMaxDeliveryAttempts = 5
	DefaultTimeout             = 30 * time.Second
)

// Options configure an Engine. DB, ConsumerID, Handler and DeadLetters are
// required.
type Options struct {
	DB DB
	// ConsumerID names the consumer: the ledger's consumerId and the inbox's
	// scope.
	ConsumerID string
	// Subscription is the consumer's subscription id, used when a delivery
	// does not name it.
	Subscription string
	// Handler applies events (a *Mux, a projection, a forwarder, ...).
	Handler Handler
	// DeadLetters receives poison messages on <topic>.dlq.
	DeadLetters Publisher
	// Ledger, when set, records every attempt.
	Ledger Ledger
	// MaxDeliveryAttempts is the subscription's dead-letter threshold
	// (DefaultMaxDeliveryAttempts): a transient failure at that attempt is
	// recorded as dead-lettered.
	MaxDeliveryAttempts int
	// Timeout bounds one handler transaction (DefaultTimeout).
	Timeout time.Duration
	// Limits bound the events accepted.
	Limits event.Limits
	// Logger receives the structured logs (logging.Discard when nil).
	Logger *slog.Logger
}

// Engine handles deliveries for one consumer. It is safe for concurrent use.
type Engine struct{ o Options }

// New returns an engine over o.
func New(o Options) (*Engine, error) {
	switch {
	case o.DB == nil:
		return nil, errors.New("consumer: Options.DB is required")
	case o.Handler == nil:
		return nil, errors.New("consumer: Options.Handler is required")
	case o.DeadLetters == nil:
		return nil, errors.New("consumer: Options.DeadLetters is required")
	}
	if err := names.ValidateConsumer(o.ConsumerID); err != nil {
		return nil, fmt.Errorf("consumer: Options.ConsumerID: %w", err)
	}
	if o.MaxDeliveryAttempts <= 0 {
		o.MaxDeliveryAttempts = DefaultMaxDeliveryAttempts
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Logger == nil {
		o.Logger = logging.Discard()
	}
	return &Engine{o: o}, nil
}

// Result is what the engine did with one delivery.
type Result struct {
	// Status is the HTTP status to answer: 200 acknowledges, 503 asks for
	// a redelivery.
	Status int `json:"-"`
	// Outcome is the attempt's outcome ("" when no attempt was made: a
	// duplicate, or a message addressed to another consumer).
	Outcome ledger.Outcome `json:"outcome,omitempty"`
	// EventID is the event's id when it could be read.
	EventID string `json:"eventId,omitempty"`
	// Attempt is the consumer's attempt number.
	Attempt int `json:"attempt,omitempty"`
	// Duplicate: the inbox had already applied the event; nothing was done.
	Duplicate bool `json:"duplicate,omitempty"`
	// Ignored: the message was addressed to another consumer.
	Ignored bool `json:"ignored,omitempty"`
	// Code and Error say what failed.
	Code  string `json:"code,omitempty"`
	Error string `json:"error,omitempty"`
}

// Handle processes one delivery:
//
//   - a message addressed (target_consumer) to another consumer: 200, ignored;
//   - undecodable, or no valid aggregate id (poison): published to
//     <topic>.dlq with the reason, recorded, 200;
//   - already in the inbox (duplicate): the attempt that applied it is
//     recorded again (a lost ledger write heals), 200;
//   - otherwise one transaction: inbox row, handler, child events; then:
//     success → commit, record, 200; permanent error → roll back, record,
//     200; poison (no handler for the type/schema version) → roll back,
//     dead-letter, record, 200; transient error (gap, timeout, database) →
//     roll back, record (retry, or dead_lettered at the last attempt), 503.
//
// A ledger write that fails after a commit answers 503: the redelivery
// finds the inbox row and records the same attempt again.
func (e *Engine) Handle(ctx context.Context, d delivery.Delivery) Result {
	msg := d.Message
	sub := d.Subscription
	if sub == "" {
		sub = e.o.Subscription
	}
	log := e.o.Logger.With("consumer_id", e.o.ConsumerID, "message_id", msg.ID, "ordering_key", msg.OrderingKey,
		"delivery_attempt", msg.DeliveryAttempt, "subscription", sub)
	if t := msg.Attributes[topology.TargetConsumerAttr]; t != "" && t != e.o.ConsumerID {
		log.DebugContext(ctx, "consume: addressed to another consumer", "target_consumer", t)
		return Result{Status: http.StatusOK, Ignored: true}
	}
	ev, _, err := event.Decode(msg, e.o.Limits)
	if err != nil {
		reason := event.ReasonMalformed
		var de *event.DecodeError
		if errors.As(err, &de) {
			reason = de.Reason
		}
		return e.poison(ctx, log, d, sub, nil, 0, reason, err)
	}
	log = log.With(logging.Event(&ev)...)

	if attempt, ok, err := inbox.Processed(ctx, e.o.DB, e.o.ConsumerID, ev.ID); err != nil {
		log.WarnContext(ctx, "consume: the inbox is unreachable; redelivery requested", "error", err.Error())
		return Result{Status: http.StatusServiceUnavailable, EventID: ev.ID, Code: "database", Error: err.Error()}
	} else if ok {
		res := Result{Status: http.StatusOK, EventID: ev.ID, Attempt: attempt, Duplicate: true, Outcome: ledger.OutcomeSuccess}
		return e.record(ctx, log, d, sub, &ev, res, nil)
	}
	attempt, err := inbox.NextAttempt(ctx, e.o.DB, e.o.ConsumerID, ev.ID)
	if err != nil {
		log.WarnContext(ctx, "consume: the inbox is unreachable; redelivery requested", "error", err.Error())
		return Result{Status: http.StatusServiceUnavailable, EventID: ev.ID, Code: "database", Error: err.Error()}
	}
	log = log.With("attempt", attempt)

	herr, duplicate := e.apply(ctx, &ev, attempt, msg.DeliveryAttempt)
	if duplicate {
		log.InfoContext(ctx, "consume: applied concurrently by another delivery")
		return Result{Status: http.StatusOK, EventID: ev.ID, Attempt: attempt, Duplicate: true}
	}
	if herr == nil {
		res := Result{Status: http.StatusOK, EventID: ev.ID, Attempt: attempt, Outcome: ledger.OutcomeSuccess}
		return e.record(ctx, log, d, sub, &ev, res, nil)
	}
	class, code := Classify(herr)
	switch class {
	case ClassPoison:
		return e.poison(ctx, log, d, sub, &ev, attempt, code, herr)
	case ClassPermanent:
		res := Result{Status: http.StatusOK, EventID: ev.ID, Attempt: attempt, Outcome: ledger.OutcomeFailed, Code: code, Error: herr.Error()}
		return e.record(ctx, log, d, sub, &ev, res, herr)
	}
	res := Result{Status: http.StatusServiceUnavailable, EventID: ev.ID, Attempt: attempt, Outcome: ledger.OutcomeRetry, Code: code, Error: herr.Error()}
	last := msg.DeliveryAttempt
	if last == 0 {
		last = attempt // Eventarc does not say; our own count stands in
	}
	if last >= e.o.MaxDeliveryAttempts {
		res.Outcome = ledger.OutcomeDeadLettered
	}
	return e.record(ctx, log, d, sub, &ev, res, herr)
}

// apply runs the handler in one transaction with the inbox row. It returns
// the handler's (or the database's) error, or duplicate when another
// delivery applied the event first.
func (e *Engine) apply(ctx context.Context, ev *event.Event, attempt, deliveryAttempt int) (err error, duplicate bool) {
	ctx, cancel := context.WithTimeout(ctx, e.o.Timeout)
	defer cancel()
	tx, err := e.o.DB.Begin(ctx)
	if err != nil {
		return Transient("database", err), false
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // after Commit this is a no-op
	claimed, err := inbox.Claim(ctx, tx, e.o.ConsumerID, ev.ID, attempt)
	if err != nil {
		return Transient("database", err), false
	}
	if !claimed {
		return nil, true
	}
	c := &Context{Event: ev, Tx: tx, ConsumerID: e.o.ConsumerID, Attempt: attempt, DeliveryAttempt: deliveryAttempt}
	if err := e.o.Handler.Handle(ctx, c); err != nil {
		return err, false
	}
	if err := tx.Commit(ctx); err != nil {
		return Transient("database", fmt.Errorf("commit: %w", err)), false
	}
	return nil, false
}

// poison dead-letters the delivery's message with reason, then records it.
func (e *Engine) poison(ctx context.Context, log *slog.Logger, d delivery.Delivery, sub string, ev *event.Event, attempt int, reason string, cause error) Result {
	topic := d.Topic()
	if topic == "" && ev != nil {
		topic = ev.Topic
	}
	if topic == "" {
		topic, _, _, _ = names.ParseSubscription(sub)
	}
	res := Result{Status: http.StatusOK, Attempt: attempt, Outcome: ledger.OutcomePoison, Code: reason, Error: cause.Error()}
	if ev != nil {
		res.EventID = ev.ID
	} else {
		res.EventID = d.Message.Attributes["event_id"]
	}
	if topic == "" {
		log.ErrorContext(ctx, "consume: poison message of unknown topic; acknowledged without a dead letter", "reason", reason, "error", cause.Error())
		return res
	}
	dl := deadletter.Poison(d.Message, reason, cause.Error(), e.o.ConsumerID, sub, now())
	if _, err := e.o.DeadLetters.Publish(ctx, names.DeadLetter(topic), dl); err != nil {
		log.ErrorContext(ctx, "consume: cannot dead-letter a poison message; redelivery requested", "reason", reason, "error", err.Error())
		return Result{Status: http.StatusServiceUnavailable, EventID: res.EventID, Code: "dead_letter", Error: err.Error()}
	}
	log.ErrorContext(ctx, "consume: poison message dead-lettered", "reason", reason, "error", cause.Error(), "dead_letter_topic", names.DeadLetter(topic))
	if ev == nil {
		if res.EventID == "" {
			return res // nothing to record it under
		}
		// Undecodable, but its id is known: the ledger shows the poison.
		ev = &event.Event{ID: res.EventID, Topic: topic}
		n, err := inbox.NextAttempt(ctx, e.o.DB, e.o.ConsumerID, ev.ID)
		if err != nil {
			log.WarnContext(ctx, "consume: cannot number the poison attempt; not recorded in the ledger", "error", err.Error())
			return res
		}
		res.Attempt = n
	}
	return e.record(ctx, log, d, sub, ev, res, cause)
}

// record writes the attempt to the ledger and logs the result. A ledger
// failure turns an acknowledgement into 503, so the redelivery records again.
func (e *Engine) record(ctx context.Context, log *slog.Logger, d delivery.Delivery, sub string, ev *event.Event, res Result, cause error) Result {
	if e.o.Ledger != nil && res.Outcome != "" {
		a := ledger.Attempt{
			EventID: ev.ID, ConsumerID: e.o.ConsumerID, AttemptNo: res.Attempt,
			Success: res.Outcome == ledger.OutcomeSuccess, Outcome: res.Outcome,
			ErrorCode: res.Code, ErrorMessage: res.Error, ConsumedAt: now(),
			Topic: ev.Topic, Subscription: sub, MessageID: d.Message.ID, DeliveryAttempt: d.Message.DeliveryAttempt,
		}
		if err := e.recordAttempt(ctx, a); err != nil {
			log.WarnContext(ctx, "consume: the ledger did not record the attempt; redelivery requested", "outcome", string(res.Outcome), "error", err.Error())
			return Result{Status: http.StatusServiceUnavailable, EventID: res.EventID, Attempt: res.Attempt, Code: "ledger", Error: err.Error()}
		}
	}
	switch {
	case res.Outcome == ledger.OutcomeSuccess && res.Duplicate:
		log.InfoContext(ctx, "consume: duplicate; already applied")
	case res.Outcome == ledger.OutcomeSuccess:
		log.InfoContext(ctx, "consume: applied")
	case res.Outcome == ledger.OutcomeFailed:
		log.ErrorContext(ctx, "consume: permanent error; acknowledged", "code", res.Code, "error", errString(cause))
	case res.Outcome == ledger.OutcomeRetry || res.Outcome == ledger.OutcomeDeadLettered:
		log.WarnContext(ctx, "consume: transient error; redelivery requested", "code", res.Code, "error", errString(cause), "outcome", string(res.Outcome))
	}
	return res
}

// recordAttempt writes the attempt, retrying a failed write three times
// within about a second (Firestore answers ABORTED when a rollup holds the
// event's locks) before the delivery falls back on Pub/Sub's redelivery.
func (e *Engine) recordAttempt(ctx context.Context, a ledger.Attempt) error {
	wait := 100 * time.Millisecond
	for try := 1; ; try++ {
		err := e.o.Ledger.RecordAttempt(ctx, a)
		if err == nil || try == 4 || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait + time.Duration(rand.Int64N(int64(wait)))):
		}
		wait *= 2
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
