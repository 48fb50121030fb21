// Package consumer is relaybus's consuming engine: for each delivery it
// decodes the event, deduplicates it in the inbox, runs the consumer's
// handler with the same Postgres transaction, lets the handler emit child
// events into the outbox in that transaction, commits, records the attempt
// in the ledger, and classifies every failure (see [Engine.Handle]).
//
// Handlers are registered by event type and schema version on a [Mux]:
//
//	mux := consumer.NewMux()
//	mux.RegisterFunc("order.purchased", "v1", func(ctx context.Context, c *consumer.Context) error {
//		_, err := c.Tx.Exec(ctx, `UPDATE ...`, c.Event.AggregateID)
//		return err
//	})
package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
)

// Context is what a handler gets: the event, the transaction its effects
// go into, and the delivery's facts.
type Context struct {
	// Event is the decoded event.
	Event *event.Event
	// Tx is the delivery's transaction: the inbox row, the handler's writes
	// and emitted child events commit together or not at all.
	Tx pgx.Tx
	// ConsumerID names the consumer.
	ConsumerID string
	// Attempt is this consumer's attempt number at this event, from 1.
	Attempt int
	// DeliveryAttempt is Pub/Sub's delivery attempt (0 when unknown).
	DeliveryAttempt int

	emittedIDs []string
}

// Emit enqueues child events in the delivery's transaction. Each child
// gets the parent's trace and correlation ids and the parent's id as
// parentEventId (causation), unless already set; its source defaults to
// the consumer. Once the delivery commits, the engine kicks them (its
// Kicker), so they reach Pub/Sub within milliseconds.
func (c *Context) Emit(ctx context.Context, children ...*event.Event) error {
	for _, e := range children {
		if e.ParentEventID == "" {
			e.ParentEventID = c.Event.ID
		}
		if e.TraceID == "" {
			e.TraceID = c.Event.TraceID
		}
		if e.CorrelationID == "" {
			e.CorrelationID = c.Event.CorrelationID
		}
		if e.Source == "" && e.Initiator.Service == "" {
			e.Source = c.ConsumerID
		}
		if e.Initiator == (event.Initiator{}) {
			e.Initiator = c.Event.Initiator
			e.Initiator.Service = c.ConsumerID
		}
	}
	res, err := outbox.Enqueue(ctx, c.Tx, children...)
	if err != nil {
		return Permanent("emit", fmt.Errorf("emit child events: %w", err))
	}
	for _, r := range res {
		if !r.Duplicate {
			c.emittedIDs = append(c.emittedIDs, r.ID)
		}
	}
	return nil
}

// Handler applies one event.
type Handler interface {
	Handle(ctx context.Context, c *Context) error
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, c *Context) error

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, c *Context) error { return f(ctx, c) }

// Any matches every event type or every schema version in Mux.Register.
const Any = "*"

// Mux routes events to handlers by event type and schema version; the most
// specific registration wins (type+version, type+Any, Any+version, Any+Any).
// An event nothing matches is poison (ErrNoHandler).
type Mux struct {
	routes map[[2]string]Handler
}

// NewMux returns an empty Mux.
func NewMux() *Mux { return &Mux{routes: map[[2]string]Handler{}} }

// Register registers h for eventType and schemaVersion (either may be Any).
func (m *Mux) Register(eventType, schemaVersion string, h Handler) {
	m.routes[[2]string{eventType, schemaVersion}] = h
}

// RegisterFunc registers f for eventType and schemaVersion.
func (m *Mux) RegisterFunc(eventType, schemaVersion string, f func(ctx context.Context, c *Context) error) {
	m.Register(eventType, schemaVersion, HandlerFunc(f))
}

// ErrNoHandler means no handler takes the event's type and schema version.
var ErrNoHandler = errors.New("no handler for this event type and schema version")

// Handle routes c to the matching handler.
func (m *Mux) Handle(ctx context.Context, c *Context) error {
	for _, k := range [][2]string{
		{c.Event.Type, c.Event.SchemaVersion}, {c.Event.Type, Any},
		{Any, c.Event.SchemaVersion}, {Any, Any},
	} {
		if h, ok := m.routes[k]; ok {
			return h.Handle(ctx, c)
		}
	}
	return fmt.Errorf("%w: %s %s", ErrNoHandler, c.Event.Type, c.Event.SchemaVersion)
}

// Class is how a failure is treated.
type Class int

// Failure classes (ARCHITECTURE.md's error taxonomy).
const (
	// ClassTransient: answer non-2xx; Pub/Sub redelivers with backoff and
	// dead-letters after the subscription's maximum attempts.
	ClassTransient Class = iota
	// ClassPermanent: a business error that no retry can fix: acknowledge
	// and record it.
	ClassPermanent
	// ClassPoison: the message can never be handled: acknowledge and
	// publish it to <topic>.dlq with the reason.
	ClassPoison
)

// Error is a classified handler error with a short machine-readable code.
type Error struct {
	Class Class
	Code  string
	Err   error
}

func (e *Error) Error() string { return e.Code + ": " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Permanent marks err as a permanent business error with a code.
func Permanent(code string, err error) error {
	return &Error{Class: ClassPermanent, Code: code, Err: err}
}

// Transient marks err as transient: the delivery is retried.
func Transient(code string, err error) error {
	return &Error{Class: ClassTransient, Code: code, Err: err}
}

// Poison marks err as making the message unprocessable forever.
func Poison(code string, err error) error { return &Error{Class: ClassPoison, Code: code, Err: err} }

// ErrGap is the strict handlers' transient error: an earlier version of the
// aggregate has not been applied yet, so this one must come back later.
var ErrGap = errors.New("version gap: an earlier version has not been applied yet")

// Classify returns err's class and code: *Error says so itself; ErrGap is
// transient ("gap"); ErrNoHandler is poison ("no_handler"); a context
// deadline is transient ("timeout"); anything else is transient ("error").
func Classify(err error) (Class, string) {
	var e *Error
	switch {
	case errors.As(err, &e):
		return e.Class, e.Code
	case errors.Is(err, ErrGap):
		return ClassTransient, "gap"
	case errors.Is(err, ErrNoHandler):
		return ClassPoison, "no_handler"
	case errors.Is(err, context.DeadlineExceeded):
		return ClassTransient, "timeout"
	}
	return ClassTransient, "error"
}

// now is the engine's clock.
var now = func() time.Time { return time.Now().UTC() }
