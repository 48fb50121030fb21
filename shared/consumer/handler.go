// Package consumer is relaybus's consuming engine: for each delivery it
// decodes the event, deduplicates it in the inbox, runs the consumer's
// handler with the same Postgres transaction, lets the handler emit child
// events into the outbox in that transaction, commits, records the attempt
// in the ledger, and classifies every failure (see [Engine.Handle]).
//
// Besides applying its own event, a handler may park it to apply later
// ([Context.Park]) and settle other events the consumer holds in the same
// transaction ([Context.ApplyOther], [Context.RecordAttempt]): that is how
// shared/projection's resequencer keeps strict order without redeliveries.
// Their attempts are committed with the delivery and shipped to the ledger
// after it. A [Remote] handler (shared/forward) runs with no transaction
// open: the engine claims the event, calls it, and records the outcome.
//
// Handlers are registered by event type and schema version on a [Mux]:
//
//	mux := consumer.NewMux()
//	mux.RegisterFunc("order.purchased", "v1", func(ctx context.Context, c *consumer.Context) error {
//		_, err := c.Tx.Exec(ctx, `UPDATE ...`, c.Event.AggregateID)
//		return err
//	})
//
// or with the payload decoded into a Go type per schema version
// ([Register]; a change published in several versions side by side is
// applied once, see [Mux.Handle]):
//
//	consumer.Register(mux, "order.purchased", "v2", func(ctx context.Context, c *consumer.Context, o *orderpb.PurchasedV2) error {
//		...
//	})
package consumer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/relaybus/relaybus/internal/ledger/model"

	"github.com/jackc/pgx/v5"

	"github.com/relaybus/relaybus/internal/inbox"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
)

// Context is what a handler gets: the event, the transaction its effects
// go into, and the delivery's facts.
type Context struct {
	// Event is the decoded event (nil in Engine.Do, which runs outside any
	// delivery).
	Event *event.Event
	// Tx is the delivery's transaction: the inbox row, the handler's writes
	// and emitted child events commit together or not at all. It is nil for
	// a Remote handler, which runs with no transaction open.
	Tx pgx.Tx
	// ConsumerID names the consumer.
	ConsumerID string
	// Attempt is this consumer's attempt number at this event, from 1.
	Attempt int
	// DeliveryAttempt is Pub/Sub's delivery attempt (0 when unknown).
	DeliveryAttempt int
	// Subscription and MessageID are the delivery's subscription and
	// Pub/Sub message id ("" when unknown).
	Subscription, MessageID string

	engine     *Engine // nil when the Context was not made by an engine
	emittedIDs []string
	// recorded are the attempts at other events settled in this
	// transaction (ApplyOther, RecordAttempt), shipped after the commit.
	recorded []inbox.Attempt
	// parkCode and parkMessage, when set, make the attempt parked (Park).
	parkCode, parkMessage string
	// atCommit, when deferAtCommit, is the statement AtCommit queued.
	atCommit      *lastStatement
	deferAtCommit bool
	// txValues are TxValue's, shared by the Contexts of one pack's
	// transaction; nil in a transaction of one event.
	txValues map[any]any
}

// TxValue returns what a handler stored under key with SetTxValue earlier
// in this transaction (nil when nothing was). The events of a pack are
// handled in one transaction, one Context each, and share these values: a
// handler keeps there what it learned of the transaction's state (a row it
// locked, the version it moved it to), so the next event in the same
// transaction need not ask the database again. They are a cache across
// events: a transaction of one event (a delivery of its own, ApplyOther's
// savepoint, Engine.Do) has no next event to read them, keeps none, and
// TxValue returns nil there.
func (c *Context) TxValue(key any) any { return c.txValues[key] }

// SetTxValue stores value under key for the rest of the transaction's
// events (see TxValue; a no-op where there are none). Use a key of an
// unexported type of your own, as with context.WithValue.
func (c *Context) SetTxValue(key, value any) {
	if c.txValues != nil {
		c.txValues[key] = value
	}
}

// lastStatement is a statement AtCommit queued for the commit.
type lastStatement struct {
	sql  string
	args []any
	scan func(pgx.Row) error
}

// AtCommit runs sql (with args) as the handler's last statement: in a
// delivery, the engine sends it with the transaction's COMMIT, in one round
// trip where the statement and then the commit take two. scan, when not
// nil, is given its first row (pgx.ErrNoRows from its Scan when it
// returned none) as the answer arrives, before the commit's own: it may
// only observe (a metric, a log); an error it returns is logged, and the
// attempt's outcome does not change. The statement runs after everything
// else the handler did; if it fails, the whole attempt rolls back and is
// retried as if the handler had returned Transient("database", err), so
// the handler does not see its error. A second call runs the first
// statement at once, in c.Tx, and queues the new one.
//
// Outside a delivery (Engine.Do, ApplyOther's handler, a Context not made
// by an engine) AtCommit runs the statement at once, calls scan, and
// returns the statement's error, else scan's.
func (c *Context) AtCommit(ctx context.Context, sql string, args []any, scan func(pgx.Row) error) error {
	if !c.deferAtCommit {
		scanErr, err := (&lastStatement{sql: sql, args: args, scan: scan}).run(ctx, c.Tx)
		if err != nil {
			return err
		}
		return scanErr
	}
	if err := c.flushAtCommit(ctx); err != nil {
		return err
	}
	c.atCommit = &lastStatement{sql: sql, args: args, scan: scan}
	return nil
}

// flushAtCommit runs the queued last statement now, in c.Tx.
func (c *Context) flushAtCommit(ctx context.Context) error {
	st := c.atCommit
	c.atCommit = nil
	if st == nil {
		return nil
	}
	scanErr, err := st.run(ctx, c.Tx)
	c.engine.logScan(ctx, scanErr)
	return err
}

// run runs the statement in tx and gives its row to scan. It returns
// scan's error (an observation's), then the statement's.
func (st *lastStatement) run(ctx context.Context, tx pgx.Tx) (scanErr, err error) {
	if st.scan == nil {
		_, err := tx.Exec(ctx, st.sql, st.args...)
		return nil, err
	}
	rows, err := tx.Query(ctx, st.sql, st.args...)
	if err != nil {
		return nil, err
	}
	collected := false
	for rows.Next() {
		if !collected {
			scanErr = st.scan(rows)
			collected = true
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if !collected {
		scanErr = st.scan(noRow{})
	}
	return scanErr, nil
}

// noRow is the row of a statement that returned none.
type noRow struct{}

func (noRow) Scan(...any) error { return pgx.ErrNoRows }

// Park tells the engine that the handler accepted the event without
// applying it yet: it stored it in c.Tx to apply later (a strict
// consumer's resequencer holding an event that arrived before its
// predecessor). The delivery commits and is acknowledged like a success,
// the inbox keeps the event (redeliveries are duplicates), and the attempt
// is recorded with outcome parked, code and message. Whoever applies the
// event later records that with ApplyOther.
func (c *Context) Park(code, message string) {
	c.parkCode, c.parkMessage = code, message
}

// Via says how another event reached the consumer: the delivery facts its
// attempts are recorded with.
type Via struct {
	Subscription, MessageID string
	DeliveryAttempt         int
}

// ApplyOther applies another event the consumer holds in its inbox (a
// parked event whose turn has come) in c's transaction, as one more attempt
// of this consumer at it: the attempt is counted, h runs with a Context of
// its own for ev whose Tx is a savepoint of c.Tx, and the attempt is
// recorded in the transaction (inbox.Settle) with the outcome: success; or,
// with h's work rolled back to the savepoint, retry (a transient error:
// the event stays held, nothing redelivers it, whoever holds it tries
// again), poison (published to <topic>.dlq when c comes from an engine)
// or failed (a permanent error); a final failure releases the event's
// inbox row so that a replay or a re-push can apply it. The child events
// h emitted join c's when it succeeded; the attempt is shipped to the
// ledger once c's transaction commits (and dropped with it if c's own work
// is rolled back). It returns the outcome and h's error (nil on success);
// an error recording the attempt is returned as a transient error with an
// empty outcome, and c's work should then fail too.
func (c *Context) ApplyOther(ctx context.Context, ev *event.Event, via Via, h Handler) (model.Outcome, error) {
	n, err := inbox.Next(ctx, c.Tx, c.ConsumerID, ev.ID)
	if err != nil {
		return "", Transient("database", err)
	}
	sp, err := c.Tx.Begin(ctx)
	if err != nil {
		return "", Transient("database", err)
	}
	oc := &Context{Event: ev, Tx: sp, ConsumerID: c.ConsumerID, Attempt: n, DeliveryAttempt: via.DeliveryAttempt,
		Subscription: via.Subscription, MessageID: via.MessageID, engine: c.engine}
	a := inbox.Attempt{ConsumerID: c.ConsumerID, EventID: ev.ID, AttemptNo: n, Topic: ev.Topic,
		Subscription: via.Subscription, MessageID: via.MessageID, DeliveryAttempt: via.DeliveryAttempt}
	herr := h.Handle(ctx, oc)
	if herr == nil && oc.parkCode != "" {
		herr = Permanent("parked_twice", errors.New("a held event cannot be parked again"))
	}
	if herr == nil {
		a.Outcome, a.ConsumedAt = string(model.OutcomeSuccess), now()
		if _, err := inbox.Settle(ctx, sp, a); err != nil {
			herr = Transient("database", err)
		} else if err := sp.Commit(ctx); err != nil {
			return "", Transient("database", err)
		} else {
			c.emittedIDs = append(c.emittedIDs, oc.emittedIDs...)
			c.recorded = append(c.recorded, oc.recorded...)
			c.recorded = append(c.recorded, a)
			return model.OutcomeSuccess, nil
		}
	}
	if err := sp.Rollback(ctx); err != nil {
		return "", Transient("database", err)
	}
	class, code := Classify(herr)
	outcome := model.OutcomeRetry
	switch class {
	case ClassPermanent:
		outcome = model.OutcomeFailed
	case ClassPoison:
		outcome = model.OutcomeFailed
		if c.engine != nil {
			if err := c.engine.deadLetterEvent(ctx, ev, via, code, herr); err != nil {
				outcome, code = model.OutcomeRetry, "dead_letter"
			} else {
				outcome = model.OutcomePoison
			}
		}
	}
	a.Outcome, a.ErrorCode, a.ErrorMessage, a.ConsumedAt = string(outcome), code, herr.Error(), now()
	if _, err := inbox.Settle(ctx, c.Tx, a); err != nil {
		return "", Transient("database", err)
	}
	c.recorded = append(c.recorded, a)
	return outcome, herr
}

// RecordAttempt records, in c's transaction, an attempt at another event
// the consumer holds in its inbox without applying it (a parked event
// whose gap stayed open too long: outcome stalled) and returns its number
// (0 when that attempt was recorded already). ConsumerID and ConsumedAt
// default to c's and now, AttemptNo 0 takes the event's next number, and
// the inbox row follows the outcome as inbox.Settle says. The engine ships
// it to the ledger once c's transaction commits.
func (c *Context) RecordAttempt(ctx context.Context, a inbox.Attempt) (int, error) {
	if a.ConsumerID == "" {
		a.ConsumerID = c.ConsumerID
	}
	if a.ConsumedAt.IsZero() {
		a.ConsumedAt = now()
	}
	n, err := inbox.Settle(ctx, c.Tx, a)
	if err != nil || n == 0 {
		return 0, err
	}
	a.AttemptNo = n
	c.recorded = append(c.recorded, a)
	return n, nil
}

// Emit enqueues child events in the delivery's transaction. Each child
// gets the parent's trace and correlation ids and the parent's id as
// parentEventId (causation), unless already set; its source defaults to
// the consumer. Once the delivery commits, the engine kicks them (its
// Kicker), so they reach Pub/Sub within milliseconds. With the engine's
// Contract set, a child whose payload breaks its topic's schema fails the
// attempt as a permanent error, and a child on a topic nobody consumes is
// skipped (EmitResults says so). Emit is EmitResults without the results.
func (c *Context) Emit(ctx context.Context, children ...*event.Event) error {
	_, err := c.EmitResults(ctx, children...)
	return err
}

// EmitResults is Emit, returning what became of each child, in order: its
// outbox state, outbox.StateSkipped (with the reason) for a child whose
// topic is unknown or has no enabled consumer (logged at ERROR, nothing
// written, the delivery goes on), Duplicate for a child already enqueued
// (the same id, topic, aggregate, version, type and payload). A child whose
// id or aggregate version another event holds fails the attempt as a
// permanent error (outbox.ErrEventIDConflict, outbox.ErrVersionConflict).
func (c *Context) EmitResults(ctx context.Context, children ...*event.Event) ([]outbox.Enqueued, error) {
	if c.Tx == nil {
		return nil, Permanent("emit", errors.New("emit child events: no transaction (a Remote handler cannot emit)"))
	}
	if c.engine != nil && c.engine.o.Emits != nil {
		for _, e := range children {
			if !slices.Contains(c.engine.o.Emits, e.Topic) {
				return nil, Permanent("emit_undeclared", fmt.Errorf("emit child event %s on topic %q: consumer %s declares emits %v in infra/topology.yaml; add the topic there (its service account may publish only to those)",
					e.Type, e.Topic, c.ConsumerID, c.engine.o.Emits))
			}
		}
	}
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
		if e.SourceVersion == "" && c.engine != nil {
			e.SourceVersion = c.engine.o.SourceVersion
		}
		if e.Source == "" && e.Initiator.Service == "" {
			e.Source = c.ConsumerID
		}
		if e.Initiator == (event.Initiator{}) {
			e.Initiator = c.Event.Initiator
			e.Initiator.Service = c.ConsumerID
		}
	}
	var (
		res []outbox.Enqueued
		err error
	)
	if c.engine != nil && c.engine.o.Contract != nil {
		p := outbox.Producer{Contract: c.engine.o.Contract, Logger: c.engine.o.Logger}
		res, err = p.Enqueue(ctx, c.Tx, children...)
	} else {
		res, err = outbox.Enqueue(ctx, c.Tx, children...)
	}
	switch {
	case errors.Is(err, event.ErrInvalid), errors.Is(err, event.ErrTooLarge), errors.Is(err, outbox.ErrVersionConflict),
		errors.Is(err, outbox.ErrEventIDConflict):
		// The child itself is wrong: no retry makes it right.
		return nil, Permanent("emit", fmt.Errorf("emit child events: %w", err))
	case err != nil:
		// The database (or the topic registry): the delivery is redelivered.
		return nil, Transient("database", fmt.Errorf("emit child events: %w", err))
	}
	for _, r := range res {
		if !r.Duplicate && r.State != outbox.StateSkipped {
			c.emittedIDs = append(c.emittedIDs, r.ID)
		}
	}
	return res, nil
}

// Handler applies one event.
type Handler interface {
	Handle(ctx context.Context, c *Context) error
}

// Remote is a handler whose effect is a call to another service
// (shared/forward's forwarder). The engine holds no transaction open while
// it runs: it claims the event in the inbox and commits, calls Handle with
// c.Tx nil, then records the outcome (see Engine.Handle and the inbox's
// package documentation). The other service must be idempotent on the
// event id: a process that dies after the call and before the record is
// followed, once the claim's lease has run out, by one more call.
type Remote interface {
	Handler
	// Lease is how long a claim stands before another delivery may take it
	// over: longer than one call may take (the handler's own timeout) plus
	// the time to record its outcome.
	Lease() time.Duration
}

// Gate is a Remote handler that may hold deliveries back before any
// attempt is made: shared/forward's circuit breaker, while its target is
// down. The engine asks Admit before it claims the event; a refusal
// (*HeldError) answers 503 with Result.Code CodeHeld and RetryAfter, and
// counts no attempt: nothing is claimed or recorded, so the consumer's
// own attempt count, and the dead-letter decision made from it, counts
// only attempts that reached the handler. When Admit lets a delivery
// through, the engine calls done once the delivery is over, with
// whether the handler ran. A Gate's Handle may return a *HeldError too
// (the call found the other service down and the gate closed behind
// it): the engine releases the claim without recording an attempt and
// answers as for a refusal.
type Gate interface {
	Remote
	Admit(ctx context.Context) (done func(called bool), err error)
}

// CodeHeld is Result.Code of a delivery a Gate held back.
const CodeHeld = "held"

// HeldError is a Gate's refusal: the delivery was not attempted; try
// again after RetryAfter.
type HeldError struct {
	// RetryAfter is how long until the gate may let a delivery through.
	RetryAfter time.Duration
	// Reason says why, for the logs and the answer.
	Reason string
}

func (e *HeldError) Error() string { return e.Reason }

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

// Handle routes c to the matching handler. An event of a change
// published in several schema versions (event.SideBySide) is applied in
// one version only; see sideBySide.
func (m *Mux) Handle(ctx context.Context, c *Context) error {
	if skip, err := m.sideBySide(ctx, c); skip || err != nil {
		return err
	}
	for _, k := range [][2]string{
		{c.Event.Type, c.Event.SchemaVersion}, {c.Event.Type, Any},
		{Any, c.Event.SchemaVersion}, {Any, Any},
	} {
		if h, ok := m.routes[k]; ok {
			return h.Handle(ctx, c)
		}
	}
	if vs := m.versions(c.Event.Type); len(vs) > 0 {
		// An unknown schema version (a producer upgrading publishes the
		// new version beside the old until every consumer reads it, see
		// docs/consuming.md "Two schema versions side by side"): poison, as
		// every ErrNoHandler (reason no_handler), dead-lettered for an
		// operator to replay once the consumer reads it; the message
		// names the versions it reads.
		return fmt.Errorf("%w: %s %s (unknown schema version: this consumer reads %s)",
			ErrNoHandler, c.Event.Type, c.Event.SchemaVersion, strings.Join(vs, ", "))
	}
	return fmt.Errorf("%w: %s %s", ErrNoHandler, c.Event.Type, c.Event.SchemaVersion)
}

// Class is how a failure is treated.
type Class int

// Failure classes: each error a handler returns falls in one of these
// (an unclassified error is transient), and its class decides whether the
// delivery is redelivered, acknowledged and recorded as failed, or
// dead-lettered (docs/consuming.md "Outcomes and answers").
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

// Error returns the code and the handler's error.
func (e *Error) Error() string { return e.Code + ": " + e.Err.Error() }

// Unwrap returns the handler's error.
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

// ErrGap is a transient error a custom in-order handler may answer: an
// earlier version of the aggregate has not been applied yet, so this one
// must come back later (each redelivery costs one of the subscription's
// delivery attempts). shared/projection's strict handler parks such a
// version instead.
var ErrGap = errors.New("version gap: an earlier version has not been applied yet")

// Classify returns err's class and code: *Error says so itself; ErrGap is
// transient ("gap"); ErrNoHandler is poison ("no_handler"); a context
// deadline, or a statement Postgres cancelled for it (SQLSTATE 57014), is
// transient ("timeout"); anything else is transient ("error").
func Classify(err error) (Class, string) {
	var e *Error
	switch {
	case errors.As(err, &e):
		return e.Class, e.Code
	case errors.Is(err, ErrGap):
		return ClassTransient, "gap"
	case errors.Is(err, ErrNoHandler):
		return ClassPoison, "no_handler"
	case errors.Is(err, context.DeadlineExceeded) || cancelledStatement(err):
		return ClassTransient, "timeout"
	}
	return ClassTransient, "error"
}

// cancelledStatement reports whether err is Postgres's query_canceled
// (SQLSTATE 57014): a statement cancelled because its context ended (the
// pools cancel it in the server and keep the connection).
func cancelledStatement(err error) bool {
	var st interface{ SQLState() string }
	return errors.As(err, &st) && st.SQLState() == "57014"
}

// now is the engine's clock.
var now = func() time.Time { return time.Now().UTC() }
