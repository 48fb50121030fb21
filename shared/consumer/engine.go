package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/relaybus/relaybus/internal/cloudevent"
	"github.com/relaybus/relaybus/internal/ledger/model"

	"github.com/jackc/pgx/v5"

	"github.com/relaybus/relaybus/internal/batch"
	"github.com/relaybus/relaybus/internal/deadletter"
	"github.com/relaybus/relaybus/internal/delivery"
	"github.com/relaybus/relaybus/internal/inbox"
	"github.com/relaybus/relaybus/internal/logging"
	"github.com/relaybus/relaybus/internal/names"
	"github.com/relaybus/relaybus/internal/pack"
	"github.com/relaybus/relaybus/internal/telemetry"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/postgres"
	"github.com/relaybus/relaybus/shared/topology"
)

// DB is what the engine needs of Postgres (a *pgxpool.Pool).
type DB interface {
	postgres.DBTX
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Ledger records attempts in the ledger (internal/ledger's Recorder).
type Ledger interface {
	// RecordAttempts records the attempts (idempotent on consumer, event
	// and attempt number) and hands them to the rollup, which folds them
	// into their events.
	RecordAttempts(ctx context.Context, as []model.Attempt) error
}

// Kicker publishes events at once after the transaction that enqueued them
// committed (a *relay.Relay's Kick): the engine kicks the child events a
// handler emitted.
type Kicker interface {
	Kick(ids ...string)
}

// TxKicker is a Kicker that claims the child events' aggregates in the
// delivery's own transaction, before it commits (a *relay.Relay's KickIn),
// and publishes them once it committed (the function it returns): the
// claim costs no transaction of its own. The engine uses it when its
// Kicker has it.
type TxKicker interface {
	Kicker
	KickIn(ctx context.Context, tx postgres.DBTX, ids ...string) (func(), error)
}

// Defaults of Options.
const (
	DefaultMaxDeliveryAttempts = 5
	DefaultTimeout             = 30 * time.Second
	DefaultLedgerBudget        = 10 * time.Second
	DefaultShipDelay           = 10 * time.Second
)

// Options configure an Engine. DB, ConsumerID, Handler and DeadLetters are
// required.
type Options struct {
	DB DB
	// SourceVersion is this consumer's own version (its release, build or
	// revision): the SourceVersion of the child events it emits that name
	// none; empty sets none.
	SourceVersion string
	// ConsumerID names the consumer: the ledger's consumerId and the inbox's
	// scope.
	ConsumerID string
	// Subscription is the consumer's subscription id, used when a delivery
	// does not name it.
	Subscription string
	// Handler applies events (a *Mux, a projection, a forwarder, ...).
	Handler Handler
	// DeadLetters receives poison messages on <topic>.dlq.
	DeadLetters event.Publisher
	// Ledger, when set, records every attempt after the fact: attempts are
	// committed in Postgres with the delivery and shipped to the ledger in
	// the background, in batches.
	Ledger Ledger
	// LedgerBudget bounds one batch of ledger writes (DefaultLedgerBudget).
	LedgerBudget time.Duration
	// ShipDelay is how old an attempt the live shipper has not shipped must
	// be before Ship ships it (DefaultShipDelay).
	ShipDelay time.Duration
	// Kicker, when set, publishes the child events a handler emitted right
	// after the delivery commits.
	Kicker Kicker
	// Emits, when not nil, are the only topics the handler may emit child
	// events to (the topology's emits of this consumer, which is also
	// where its service account may publish the kick): a child on another
	// topic fails the attempt as a permanent error naming the topic and
	// the rule. Nil checks nothing.
	Emits []string
	// Contract, when set, checks each child event a handler emits before
	// it is written (internal/contract): its payload against its topic's
	// schema, and whether anyone consumes its topic (a child nobody
	// consumes is skipped, logged at ERROR). Nil checks neither.
	Contract outbox.Contract
	// MaxDeliveryAttempts is the subscription's dead-letter threshold
	// (DefaultMaxDeliveryAttempts): a transient failure at that attempt is
	// recorded as dead-lettered.
	MaxDeliveryAttempts int
	// Timeout bounds one handler transaction (DefaultTimeout).
	Timeout time.Duration
	// Limits bound the events accepted.
	Limits event.Limits
	// Claims, when set, reads back the data of a message that travelled
	// by claim check (internal/claimcheck's Checker) before it is decoded,
	// so handlers see the whole payload. A message that names an object
	// while Claims is nil, or whose object is missing or altered, is
	// poison (reason event.ReasonClaimCheck, naming the reference).
	Claims Fetcher
	// Logger receives the structured logs (logging.Discard when nil).
	Logger *slog.Logger
}

// Fetcher reads back a claim-checked message's data: m with its Data
// filled, m unchanged when it names no object, a *event.DecodeError when
// the object can never be read (poison), another error when the store
// failed (redelivery).
type Fetcher interface {
	Fetch(ctx context.Context, m event.Message) (event.Message, error)
}

// Engine handles deliveries for one consumer. It is safe for concurrent
// use. Close it to flush the attempts it has not shipped to the ledger.
type Engine struct {
	o     Options
	ships *batch.Batcher[inbox.Attempt]
	// marks gathers the attempts the ledger took, to mark them shipped in
	// Postgres in one statement per markWait (see ship).
	marks *batch.Batcher[inbox.Attempt]
}

// markWait is how long the shipped marks of attempts the ledger took
// gather before one statement writes them: at most a second, and well
// inside ShipDelay (the scheduled step takes only attempts older than
// that, so it almost never ships one whose mark is on its way; if it does,
// the ledger takes it again idempotently). A mark per ledger batch was a
// transaction per delivery or two under a steady load.
func markWait(shipDelay time.Duration) time.Duration {
	return min(time.Second, shipDelay/5)
}

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
	if o.LedgerBudget <= 0 {
		o.LedgerBudget = DefaultLedgerBudget
	}
	if o.ShipDelay <= 0 {
		o.ShipDelay = DefaultShipDelay
	}
	if o.Logger == nil {
		o.Logger = logging.Discard()
	}
	e := &Engine{o: o}
	if o.Ledger != nil {
		e.ships = batch.New(e.ship, batch.Options{MaxItems: 200, MaxWait: 2 * time.Millisecond, Capacity: 20_000})
		e.marks = batch.New(e.mark, batch.Options{MaxItems: 5000, MaxWait: markWait(o.ShipDelay), Capacity: 50_000})
	}
	return e, nil
}

// Handler is the handler the engine runs (Options.Handler), for the routes
// a handler serves besides deliveries (a strict consumer's gaps).
func (e *Engine) Handler() Handler { return e.o.Handler }

// ConsumerID is the consumer the engine handles deliveries for.
func (e *Engine) ConsumerID() string { return e.o.ConsumerID }

// Result is what the engine did with one delivery.
type Result struct {
	// Status is the HTTP status to answer: 200 acknowledges, 503 asks for
	// a redelivery.
	Status int `json:"-"`
	// Outcome is the attempt's outcome ("" when no attempt was made: a
	// duplicate, or a message addressed to another consumer).
	Outcome model.Outcome `json:"outcome,omitempty"`
	// EventID is the event's id when it could be read.
	EventID string `json:"eventId,omitempty"`
	// Attempt is the consumer's attempt number.
	Attempt int `json:"attempt,omitempty"`
	// Duplicate: the inbox had already applied the event; nothing was done.
	Duplicate bool `json:"duplicate,omitempty"`
	// Ignored: the message was addressed to another consumer.
	Ignored bool `json:"ignored,omitempty"`
	// Packed is how many events the message carried when it was a pack
	// (internal/pack; 0 when it was not). A pack's answer is 200 once all
	// of them are settled; otherwise it is the first unsettled event's.
	Packed int `json:"packed,omitempty"`
	// Code and Error say what failed.
	Code  string `json:"code,omitempty"`
	Error string `json:"error,omitempty"`
	// RetryAfter is set when a Gate held the delivery back (Code
	// CodeHeld): how long until it may let one through. No attempt was
	// made or counted.
	RetryAfter time.Duration `json:"-"`
}

// Held reports whether a Gate held the delivery back without an attempt.
func (r Result) Held() bool { return r.Code == CodeHeld && r.Outcome == "" }

// Handle processes one delivery:
//
//   - a message addressed (target_consumer) to another consumer: 200, ignored;
//   - a pack (internal/pack, an aggregate's consecutive re-pushes to this
//     consumer in one message): its events in order, each as below, in
//     one transaction when they all succeed or park; 200 once all are
//     settled, else the first unsettled event's answer (see Result.Packed);
//   - undecodable, or no valid aggregate id (poison): published to
//     <topic>.dlq with the reason, the attempt recorded, 200;
//   - already applied (the inbox has it): 200, nothing done or recorded;
//   - otherwise one transaction: the attempt counted and the event claimed
//     in the inbox, the handler and its child events, the attempt recorded;
//     then: success → commit, 200; permanent error → the handler's work
//     rolled back, the failed attempt committed, 200; poison (no handler
//     for the type/schema version) → likewise and dead-lettered, 200;
//     transient error (gap, timeout, database) → likewise (retry, or
//     dead_lettered at the last attempt), 503; a handler that parked the
//     event (Context.Park) → committed like a success, outcome parked, 200,
//     and the attempts at other events it settled in the transaction
//     (Context.ApplyOther) committed with it;
//   - with a Remote handler, no transaction is open during the call: the
//     event is claimed in the inbox (committed; a live claim of another
//     delivery → 503 in_progress, an expired one is taken over), the
//     handler runs, and its outcome is recorded in one statement (success
//     → applied, 200; failure → the claim released, the failed attempt
//     recorded, answered as above). See the inbox's package documentation
//     for the states.
//   - with a Remote handler that is a Gate (shared/forward's circuit
//     breaker), a delivery the gate holds back, before the call or after
//     it, answers 503 with Code CodeHeld and RetryAfter, and no attempt
//     is claimed or recorded.
//
// The ledger never changes the answer: committed attempts are shipped to
// it afterwards (see Ship). Emitted child events are kicked (Kicker) once
// the transaction has committed.
//
// With telemetry on, the delivery is a consumer span continuing the
// producer's trace (the message's googclient_traceparent), the handler's
// work a span under it (its child events carry that span's context), and
// the delivery is counted and timed by outcome (see internal/telemetry).
func (e *Engine) Handle(ctx context.Context, d delivery.Delivery) Result {
	if !telemetry.Enabled() || pack.Is(d.Message) {
		// A pack's events are spanned and counted each (handlePack).
		return e.handle(ctx, d)
	}
	start := time.Now()
	msg := d.Message
	sub := d.Subscription
	if sub == "" {
		sub = e.o.Subscription
	}
	sub = names.ResourceID(sub)
	ctx, span := telemetry.Start(ctx, "process "+msg.Topic, telemetry.KindConsumer, msg.Attributes[telemetry.AttrTraceparent],
		telemetry.KeySystem.String(telemetry.SystemPubSub), telemetry.KeyDestination.String(msg.Topic),
		telemetry.KeySubscription.String(sub), telemetry.KeyOperationName.String("process"),
		telemetry.KeyOperationType.String("process"), telemetry.KeyMessageID.String(msg.ID), telemetry.KeyConsumer.String(e.o.ConsumerID))
	res := e.handle(ctx, d)
	at := time.Now()
	outcome := string(res.Outcome)
	switch {
	case res.Duplicate:
		outcome = "duplicate"
	case res.Ignored:
		outcome = "ignored"
	case res.Held():
		outcome = CodeHeld
	case outcome == "":
		outcome = "unavailable"
	}
	span.SetAttributes(telemetry.KeyOutcome.String(outcome), telemetry.KeyEventID.String(res.EventID), telemetry.KeyAttempt.Int(res.Attempt))
	if res.Status >= 500 || res.Outcome == model.OutcomePoison || res.Outcome == model.OutcomeFailed || res.Outcome == model.OutcomeDeadLettered {
		span.Fail(outcome + ": " + res.Code)
	}
	span.End(nil)
	telemetry.RecordConsume(ctx, msg.Topic, sub, e.o.ConsumerID, outcome, at.Sub(start))
	if res.Outcome == model.OutcomeSuccess {
		if !msg.PublishTime.IsZero() {
			telemetry.RecordHop(ctx, telemetry.HopPublishToConsume, msg.Topic, e.o.ConsumerID, at.Sub(msg.PublishTime))
		}
		if occ, err := time.Parse(time.RFC3339Nano, msg.Attributes[event.AttrOccurredAt]); err == nil {
			telemetry.RecordHop(ctx, telemetry.HopEndToEnd, msg.Topic, e.o.ConsumerID, at.Sub(occ))
		}
	}
	return res
}

func (e *Engine) handle(ctx context.Context, d delivery.Delivery) Result {
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
	if pack.Is(msg) {
		return e.handlePack(ctx, log, d, sub)
	}
	lim := e.o.Limits
	if ref := msg.Attributes[event.AttrClaimCheck]; ref != "" {
		var res Result
		var ok bool
		if msg, res, ok = e.fetchClaim(ctx, log, d, sub, ref); !ok {
			return res
		}
		// The producer's side bounded the payload; the message's own
		// limit is the broker's, which the claim check lifts.
		lim = event.Limits{MaxPayloadBytes: event.MaxClaimCheckPayload, ClaimCheck: true}
	}
	ev, info, err := cloudevent.Decode(msg, lim)
	if err != nil {
		reason := event.ReasonMalformed
		var de *event.DecodeError
		if errors.As(err, &de) {
			reason = de.Reason
		}
		if reason == event.ReasonMissingAggregateID || reason == event.ReasonInvalidAggregateID {
			telemetry.RecordAggregateID(ctx, msg.Topic, "", reason)
		}
		return e.undecodable(ctx, log, d, sub, reason, err)
	}
	telemetry.RecordAggregateID(ctx, msg.Topic, info.AggregateIDFrom, "")
	log = log.With(logging.Event(&ev)...)
	if r, ok := e.o.Handler.(Remote); ok {
		return e.remote(ctx, log, d, sub, &ev, r)
	}
	return e.attempt(ctx, log, d, sub, &ev)
}

// fetchClaim reads back the data of a claim-checked message (ref names its
// object): the message with its data, or the answer to give when the
// object cannot be read: poison (dead-lettered, naming ref) when it never
// will be, 503 (redelivery) when the store failed.
func (e *Engine) fetchClaim(ctx context.Context, log *slog.Logger, d delivery.Delivery, sub, ref string) (event.Message, Result, bool) {
	msg := d.Message
	var err error
	if e.o.Claims == nil {
		err = &event.DecodeError{Reason: event.ReasonClaimCheck, Err: fmt.Errorf("the message's data is the claim-checked object %s, and this consumer has no claim-check store (set CLAIM_CHECK_BUCKET or CLAIM_CHECK_DIR)", ref)}
	} else {
		msg, err = e.o.Claims.Fetch(ctx, msg)
	}
	if err == nil {
		return msg, Result{}, true
	}
	var de *event.DecodeError
	if errors.As(err, &de) {
		return msg, e.undecodable(ctx, log, d, sub, de.Reason, err), false
	}
	log.WarnContext(ctx, "consume: cannot read the claim-checked data; redelivery requested", "claim_check", ref, "error", err.Error())
	return msg, Result{Status: http.StatusServiceUnavailable, EventID: msg.Attributes[event.AttrEventID], Code: event.ReasonClaimCheck,
		Error: "cannot read the claim-checked data " + ref}, false
}

// attempt runs one attempt at ev in one transaction (see inbox's package
// documentation for its statements).
func (e *Engine) attempt(ctx context.Context, log *slog.Logger, d delivery.Delivery, sub string, ev *event.Event) Result {
	ctx, cancel := context.WithTimeout(ctx, e.o.Timeout)
	defer cancel()
	unavailable := func(what string, err error) Result {
		log.WarnContext(ctx, "consume: the database is unavailable; redelivery requested", "step", what, "error", err.Error())
		return Result{Status: http.StatusServiceUnavailable, EventID: ev.ID, Code: "database", Error: "the consumer's database is unavailable"}
	}
	// The attempt is recorded as a success with the claim, in one
	// statement sent with the transaction's BEGIN (one round trip); a
	// parked event corrects it, a failure rolls it back.
	a := inbox.Attempt{ConsumerID: e.o.ConsumerID, EventID: ev.ID, Outcome: string(model.OutcomeSuccess),
		ConsumedAt: now(), Topic: ev.Topic, Subscription: sub, MessageID: d.Message.ID,
		DeliveryAttempt: d.Message.DeliveryAttempt}
	tx, b, err := inbox.BeginAppliedIn(ctx, e.o.DB, a)
	if err != nil {
		return unavailable("inbox", err)
	}
	// The failure paths must finish even when ctx has ended (the handler's
	// timeout): they record what happened.
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer rcancel()
	defer tx.Rollback(rctx) //nolint:errcheck // after Commit this is a no-op
	n := b.Attempt
	if !b.Claimed {
		log.InfoContext(ctx, "consume: duplicate; already applied", "applied_attempt", b.Applied)
		return Result{Status: http.StatusOK, EventID: ev.ID, Attempt: b.Applied, Duplicate: true}
	}
	log = log.With("attempt", n)
	a.AttemptNo = n

	// The handler runs in the attempt's transaction itself, not in a
	// savepoint of it: a savepoint is a subtransaction (its own xid, WAL
	// and pg_subtrans entries) on every delivery, to serve only the rare
	// failure. A failed attempt rolls everything back instead and records
	// itself in a statement of its own (see below).
	c := &Context{Event: ev, Tx: tx, ConsumerID: e.o.ConsumerID, Attempt: n, DeliveryAttempt: d.Message.DeliveryAttempt,
		Subscription: sub, MessageID: d.Message.ID, engine: e, deferAtCommit: true}
	herr := e.runHandler(ctx, c)
	if herr == nil {
		res := Result{Status: http.StatusOK, EventID: ev.ID, Attempt: n, Outcome: model.OutcomeSuccess}
		var (
			err    error
			kicked func()
		)
		tk, kicks := e.o.Kicker.(TxKicker)
		kicks = kicks && len(c.emittedIDs) > 0
		if c.parkCode != "" || kicks {
			// The engine has statements of its own to run: the
			// handler's last one runs first, on its own.
			err = c.flushAtCommit(ctx)
		}
		if c.parkCode != "" && err == nil {
			res.Outcome, res.Code = model.OutcomeParked, c.parkCode
			a.Outcome, a.ErrorCode, a.ErrorMessage = string(res.Outcome), c.parkCode, c.parkMessage
			err = inbox.Outcome(ctx, tx, a)
		}
		if kicks && err == nil {
			kicked, err = tk.KickIn(ctx, tx, c.emittedIDs...)
		}
		if err == nil {
			err = e.commit(ctx, c)
			if err != nil && !errors.Is(err, postgres.ErrLastStatement) {
				return unavailable("commit", err)
			}
		}
		if err != nil {
			herr = Transient("database", err)
		} else {
			a.Queued = b.Queued // the committed queue row, for Shipped
			e.shipLater(ctx, log, a)
			e.afterCommit(ctx, log, c, kicked)
			if res.Outcome == model.OutcomeParked {
				log.InfoContext(ctx, "consume: parked", "code", c.parkCode, "reason", c.parkMessage)
			} else {
				log.InfoContext(ctx, "consume: applied", "emitted", len(c.emittedIDs), "settled", len(c.recorded))
			}
			return res
		}
	}

	// The handler failed: undo its work with the whole transaction (the
	// inbox claim and the count go with it), then count the attempt again
	// and record it in one statement of its own (inbox.Record with number
	// 0), which commits. A delivery of the same event that was waiting on
	// the count takes the number this attempt had; this one then takes the
	// next: numbers stay unique and every attempt is recorded.
	if err := tx.Rollback(rctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) { // closed: CommitWith rolled back
		return unavailable("rollback", err)
	}
	res := e.failure(rctx, log, d, sub, ev, n, herr)
	a.AttemptNo, a.Outcome, a.ErrorCode, a.ErrorMessage, a.ConsumedAt = 0, string(res.Outcome), res.Code, herr.Error(), now()
	m, err := inbox.Record(rctx, e.o.DB, a)
	if err != nil {
		return unavailable("record", err)
	}
	if m > 0 {
		a.AttemptNo, res.Attempt = m, m
	}
	e.shipLater(ctx, log, a)
	e.logFailure(ctx, log, ev, res)
	return res
}

// commit commits the attempt's transaction, with the handler's last
// statement (Context.AtCommit) sent with the COMMIT when the transaction
// can (a pool's BeginWith began it), else run just before. An error
// wrapping postgres.ErrLastStatement means the statement failed and
// nothing committed; any other is the commit's.
func (e *Engine) commit(ctx context.Context, c *Context) error {
	st := c.atCommit
	c.atCommit = nil
	if st == nil {
		return c.Tx.Commit(ctx)
	}
	cw, ok := c.Tx.(interface {
		CommitWith(ctx context.Context, sql string, args []any, scan func(pgx.Row) error) error
	})
	if !ok {
		scanErr, err := st.run(ctx, c.Tx)
		e.logScan(ctx, scanErr)
		if err != nil {
			return fmt.Errorf("%w: %w", postgres.ErrLastStatement, err)
		}
		return c.Tx.Commit(ctx)
	}
	scan := st.scan
	if scan != nil {
		scan = func(row pgx.Row) error {
			e.logScan(ctx, st.scan(row))
			return nil
		}
	}
	return cw.CommitWith(ctx, st.sql, st.args, scan)
}

// logScan logs the error of a last statement's scan (Context.AtCommit),
// an observation's: the attempt's outcome does not change.
func (e *Engine) logScan(ctx context.Context, err error) {
	if err != nil {
		e.o.Logger.WarnContext(ctx, "consume: the last statement's scan failed; the attempt is unchanged", "error", err.Error())
	}
}

// runHandler runs the handler on c, in a span of its own when telemetry is
// on: the child events it emits with its ctx carry that span's context.
func (e *Engine) runHandler(ctx context.Context, c *Context) error {
	if !telemetry.Enabled() {
		return e.o.Handler.Handle(ctx, c)
	}
	ctx, span := telemetry.Start(ctx, "handle "+c.Event.Type, telemetry.KindInternal, "",
		telemetry.KeyConsumer.String(e.o.ConsumerID), telemetry.KeyEventType.String(c.Event.Type), telemetry.KeyEventID.String(c.Event.ID))
	err := e.o.Handler.Handle(ctx, c)
	span.End(err)
	return err
}

// failure classifies a handler's error into the delivery's answer and
// outcome, dead-lettering a poison message.
func (e *Engine) failure(ctx context.Context, log *slog.Logger, d delivery.Delivery, sub string, ev *event.Event, n int, herr error) Result {
	class, code := Classify(herr)
	res := Result{Status: http.StatusOK, EventID: ev.ID, Attempt: n, Code: code, Error: herr.Error()}
	switch class {
	case ClassPoison:
		res.Outcome = model.OutcomePoison
		if err := e.deadLetter(ctx, d, sub, ev.Topic, code, herr); err != nil {
			log.ErrorContext(ctx, "consume: cannot dead-letter a poison message; redelivery requested", "reason", code, "error", err.Error())
			res.Status, res.Outcome, res.Code = http.StatusServiceUnavailable, model.OutcomeRetry, "dead_letter"
		}
	case ClassPermanent:
		res.Outcome = model.OutcomeFailed
	default:
		res.Status, res.Outcome = http.StatusServiceUnavailable, model.OutcomeRetry
		last := d.Message.DeliveryAttempt
		if last == 0 {
			last = n // Eventarc does not say; our own count stands in
		}
		if last >= e.o.MaxDeliveryAttempts {
			res.Outcome = model.OutcomeDeadLettered
		}
	}
	return res
}

// logFailure logs a failed attempt once it is recorded.
func (e *Engine) logFailure(ctx context.Context, log *slog.Logger, ev *event.Event, res Result) {
	switch res.Outcome {
	case model.OutcomeFailed:
		log.ErrorContext(ctx, "consume: permanent error; acknowledged", "code", res.Code, "error", res.Error)
	case model.OutcomePoison:
		log.ErrorContext(ctx, "consume: poison message dead-lettered", "reason", res.Code, "error", res.Error, "dead_letter_topic", names.DeadLetter(ev.Topic))
	default:
		log.WarnContext(ctx, "consume: transient error; redelivery requested", "code", res.Code, "error", res.Error, "outcome", string(res.Outcome))
	}
}

// afterCommit ships the attempts at other events c's handler settled and
// kicks the child events it emitted (kicked: publishes what TxKicker
// claimed in the transaction), once c's transaction has committed.
func (e *Engine) afterCommit(ctx context.Context, log *slog.Logger, c *Context, kicked func()) {
	for _, o := range c.recorded {
		e.shipLater(ctx, log, o)
	}
	if kicked != nil {
		kicked()
	} else if e.o.Kicker != nil && len(c.emittedIDs) > 0 {
		e.o.Kicker.Kick(c.emittedIDs...)
	}
}

// Do runs f in one transaction of the consumer's database outside any
// delivery (an operator's action, a scheduled check): f gets a Context
// with no event of its own (Event nil, Attempt 0) through which it may
// apply or record other events the consumer holds (Context.ApplyOther,
// Context.RecordAttempt) and emit child events. When f returns nil the
// transaction commits, then the attempts f recorded are shipped to the
// ledger and its child events kicked; otherwise it rolls back and f's
// error is returned.
func (e *Engine) Do(ctx context.Context, f func(ctx context.Context, c *Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, e.o.Timeout)
	defer cancel()
	var c *Context
	err := pgx.BeginFunc(ctx, e.o.DB, func(tx pgx.Tx) error {
		c = &Context{Tx: tx, ConsumerID: e.o.ConsumerID, engine: e}
		return f(ctx, c)
	})
	if err != nil {
		return err
	}
	e.afterCommit(ctx, e.o.Logger.With("consumer_id", e.o.ConsumerID), c, nil)
	return nil
}

// remote runs one attempt at ev with a Remote handler: claim (committed),
// call with no transaction open, record (see the inbox's package
// documentation).
func (e *Engine) remote(ctx context.Context, log *slog.Logger, d delivery.Delivery, sub string, ev *event.Event, h Remote) Result {
	ctx, cancel := context.WithTimeout(ctx, e.o.Timeout)
	defer cancel()
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer rcancel()
	unavailable := func(what string, err error) Result {
		log.WarnContext(ctx, "consume: the database is unavailable; redelivery requested", "step", what, "error", err.Error())
		return Result{Status: http.StatusServiceUnavailable, EventID: ev.ID, Code: "database", Error: "the consumer's database is unavailable"}
	}
	called := false
	if g, ok := h.(Gate); ok {
		done, err := g.Admit(ctx)
		var held *HeldError
		if errors.As(err, &held) {
			log.DebugContext(ctx, "consume: held back; no attempt made", "reason", held.Reason, "retry_after", held.RetryAfter.String())
			return Result{Status: http.StatusServiceUnavailable, EventID: ev.ID, Code: CodeHeld, Error: held.Reason, RetryAfter: held.RetryAfter}
		}
		if err != nil {
			return Result{Status: http.StatusServiceUnavailable, EventID: ev.ID, Code: CodeHeld, Error: err.Error()}
		}
		if done != nil {
			defer func() { done(called) }()
		}
	}
	cl, err := inbox.Claim(ctx, e.o.DB, e.o.ConsumerID, ev.ID, h.Lease())
	if err != nil {
		return unavailable("claim", err)
	}
	if !cl.Claimed {
		if cl.State == inbox.StateApplied {
			log.InfoContext(ctx, "consume: duplicate; already applied", "applied_attempt", cl.Applied)
			return Result{Status: http.StatusOK, EventID: ev.ID, Attempt: cl.Applied, Duplicate: true}
		}
		log.InfoContext(ctx, "consume: another delivery holds the event's claim; redelivery requested",
			"claimed_by_attempt", cl.Applied, "lease_until", cl.LeaseUntil)
		return Result{Status: http.StatusServiceUnavailable, EventID: ev.ID, Code: "in_progress",
			Error: "another delivery of this event is being handled; its claim expires at " + cl.LeaseUntil.Format(time.RFC3339)}
	}
	n := cl.Attempt
	log = log.With("attempt", n)
	a := inbox.Attempt{ConsumerID: e.o.ConsumerID, EventID: ev.ID, AttemptNo: n, Topic: ev.Topic,
		Subscription: sub, MessageID: d.Message.ID, DeliveryAttempt: d.Message.DeliveryAttempt}
	if cl.Abandoned > 0 {
		// The attempt whose claim this one took over never recorded its
		// outcome: its process stopped after claiming (and maybe after
		// calling). Say so in the record.
		ab := a
		ab.AttemptNo, ab.Outcome, ab.ErrorCode, ab.ConsumedAt = cl.Abandoned, string(model.OutcomeRetry), "abandoned", now()
		ab.ErrorMessage = "the process handling this attempt stopped before recording its outcome; its claim expired and the next delivery called again"
		ab.MessageID, ab.DeliveryAttempt = "", 0
		if m, err := inbox.Record(rctx, e.o.DB, ab); err != nil {
			log.WarnContext(ctx, "consume: cannot record the abandoned attempt", "abandoned_attempt", cl.Abandoned, "error", err.Error())
		} else if m > 0 {
			e.shipLater(ctx, log, ab)
		}
		log.WarnContext(ctx, "consume: took over an expired claim; calling again", "abandoned_attempt", cl.Abandoned)
	}
	c := &Context{Event: ev, ConsumerID: e.o.ConsumerID, Attempt: n, DeliveryAttempt: d.Message.DeliveryAttempt,
		Subscription: sub, MessageID: d.Message.ID, engine: e}
	called = true
	herr := h.Handle(ctx, c)
	if herr == nil {
		a.Outcome, a.ConsumedAt = string(model.OutcomeSuccess), now()
		ok, err := inbox.Delivered(rctx, e.o.DB, a)
		if err != nil {
			// The claim stands; once its lease runs out a redelivery calls
			// again and records.
			return unavailable("record", err)
		}
		if !ok {
			log.WarnContext(ctx, "consume: delivered, but the claim's lease ran out first and another delivery took it over; that delivery records the outcome")
			return Result{Status: http.StatusOK, EventID: ev.ID, Attempt: n, Outcome: model.OutcomeSuccess, Code: "claim_lost"}
		}
		e.shipLater(ctx, log, a)
		log.InfoContext(ctx, "consume: delivered")
		return Result{Status: http.StatusOK, EventID: ev.ID, Attempt: n, Outcome: model.OutcomeSuccess}
	}
	var held *HeldError
	if errors.As(herr, &held) {
		// The call found the target down and the gate is holding
		// deliveries back: not an attempt. The claim goes unrecorded.
		if err := inbox.Release(rctx, e.o.DB, e.o.ConsumerID, ev.ID, n); err != nil {
			return unavailable("release", err)
		}
		log.InfoContext(ctx, "consume: held back after the call; not counted as an attempt", "reason", held.Reason)
		return Result{Status: http.StatusServiceUnavailable, EventID: ev.ID, Code: CodeHeld, Error: held.Reason, RetryAfter: held.RetryAfter}
	}
	res := e.failure(rctx, log, d, sub, ev, n, herr)
	a.Outcome, a.ErrorCode, a.ErrorMessage, a.ConsumedAt = string(res.Outcome), res.Code, herr.Error(), now()
	if err := inbox.Failed(rctx, e.o.DB, a); err != nil {
		return unavailable("record", err)
	}
	e.shipLater(ctx, log, a)
	e.logFailure(ctx, log, ev, res)
	return res
}

// undecodable dead-letters a message that cannot be decoded and, when its
// event id is known, records the attempt.
func (e *Engine) undecodable(ctx context.Context, log *slog.Logger, d delivery.Delivery, sub, reason string, cause error) Result {
	topic := d.Topic()
	if topic == "" {
		topic, _, _, _ = names.ParseSubscription(sub)
	}
	res := Result{Status: http.StatusOK, Outcome: model.OutcomePoison, Code: reason, Error: cause.Error(),
		EventID: d.Message.Attributes[event.AttrEventID]}
	if topic == "" {
		log.ErrorContext(ctx, "consume: poison message of unknown topic; acknowledged without a dead letter", "reason", reason, "error", cause.Error())
		return res
	}
	if err := e.deadLetter(ctx, d, sub, topic, reason, cause); err != nil {
		log.ErrorContext(ctx, "consume: cannot dead-letter a poison message; redelivery requested", "reason", reason, "error", err.Error())
		return Result{Status: http.StatusServiceUnavailable, EventID: res.EventID, Code: "dead_letter", Error: err.Error()}
	}
	log.ErrorContext(ctx, "consume: poison message dead-lettered", "reason", reason, "error", cause.Error(), "dead_letter_topic", names.DeadLetter(topic))
	if res.EventID == "" {
		return res // nothing to record it under
	}
	// Undecodable, but its id is known: the ledger shows the poison.
	a := inbox.Attempt{ConsumerID: e.o.ConsumerID, EventID: res.EventID, Outcome: string(model.OutcomePoison),
		ErrorCode: reason, ErrorMessage: cause.Error(), ConsumedAt: now(), Topic: topic, Subscription: sub,
		MessageID: d.Message.ID, DeliveryAttempt: d.Message.DeliveryAttempt}
	n, err := inbox.Record(ctx, e.o.DB, a)
	if err != nil {
		log.WarnContext(ctx, "consume: cannot record the poison attempt", "error", err.Error())
		return res
	}
	a.AttemptNo, res.Attempt = n, n
	e.shipLater(ctx, log, a)
	return res
}

// deadLetter publishes the delivery's message to <topic>.dlq with reason.
func (e *Engine) deadLetter(ctx context.Context, d delivery.Delivery, sub, topic, reason string, cause error) error {
	dl := deadletter.Poison(d.Message, reason, cause.Error(), e.o.ConsumerID, sub, now())
	_, err := e.o.DeadLetters.Publish(ctx, names.DeadLetter(topic), dl)
	return err
}

// deadLetterEvent publishes a held event (a parked event that turned out
// poison when its turn came) to <topic>.dlq with reason, re-encoded as the
// message that brought it.
func (e *Engine) deadLetterEvent(ctx context.Context, ev *event.Event, via Via, reason string, cause error) error {
	m, err := cloudevent.Encode(ev, event.EncodingJSON)
	if err != nil {
		return err
	}
	m.ID = via.MessageID
	dl := deadletter.Poison(m, reason, cause.Error(), e.o.ConsumerID, via.Subscription, now())
	_, err = e.o.DeadLetters.Publish(ctx, names.DeadLetter(ev.Topic), dl)
	return err
}

// shipLater hands a committed attempt to the background shipper; a full
// queue leaves it to Ship.
func (e *Engine) shipLater(ctx context.Context, log *slog.Logger, a inbox.Attempt) {
	if e.ships == nil || a.AttemptNo == 0 {
		return
	}
	if !e.ships.Add(a) {
		log.WarnContext(ctx, "consume: the ledger shipper is full; the scheduled shipping step records the attempt")
	}
}

// ship records a batch of committed attempts in the ledger and hands them
// to be marked shipped (mark). A failure leaves them unshipped for Ship.
func (e *Engine) ship(ctx context.Context, as []inbox.Attempt) {
	ctx, cancel := context.WithTimeout(ctx, e.o.LedgerBudget)
	defer cancel()
	if err := e.o.Ledger.RecordAttempts(ctx, ledgerAttempts(as)); err != nil {
		e.o.Logger.WarnContext(ctx, "consume: the ledger did not record attempts; the scheduled shipping step records them",
			"consumer_id", e.o.ConsumerID, "attempts", len(as), "error", err.Error())
		return
	}
	if !e.marks.Add(as...) {
		e.mark(ctx, as) // full or closing: mark them now
	}
}

// mark marks attempts the ledger took as shipped, in one statement. A
// failure leaves them to Ship, which ships them again (idempotently).
func (e *Engine) mark(ctx context.Context, as []inbox.Attempt) {
	ctx, cancel := context.WithTimeout(ctx, e.o.LedgerBudget)
	defer cancel()
	if err := inbox.Shipped(ctx, e.o.DB, as); err != nil {
		e.o.Logger.WarnContext(ctx, "consume: cannot mark attempts shipped; they will be shipped again", "error", err.Error())
	}
}

func ledgerAttempts(as []inbox.Attempt) []model.Attempt {
	out := make([]model.Attempt, len(as))
	for i, a := range as {
		out[i] = model.Attempt{EventID: a.EventID, ConsumerID: a.ConsumerID, AttemptNo: a.AttemptNo,
			Success: a.Outcome == string(model.OutcomeSuccess), Outcome: model.Outcome(a.Outcome),
			ErrorCode: a.ErrorCode, ErrorMessage: a.ErrorMessage, ConsumedAt: a.ConsumedAt,
			Topic: a.Topic, Subscription: a.Subscription, MessageID: a.MessageID, DeliveryAttempt: a.DeliveryAttempt}
	}
	return out
}

// ShipReport says what Ship did.
type ShipReport struct {
	// Shipped attempts are now in the ledger.
	Shipped int `json:"shipped"`
	// More is true when the budget ran out with attempts left.
	More bool `json:"more"`
}

// shipBatch bounds one batch of Ship.
const shipBatch = 500

// Ship records in the ledger the attempts the background shipper missed
// (the ledger was down, the process died between its commit and the
// ledger write): committed attempts not marked shipped that are older than
// ShipDelay, in batches, until none is left or budget runs out. Concurrent
// Ship calls take different attempts. The consume function serves it at
// POST /ledger:ship for a Scheduler job. Without a ledger it does nothing.
func (e *Engine) Ship(ctx context.Context, budget time.Duration) (ShipReport, error) {
	var rep ShipReport
	if e.o.Ledger == nil {
		return rep, nil
	}
	deadline := time.Now().Add(budget)
	for time.Now().Before(deadline) {
		n := 0
		err := pgx.BeginFunc(ctx, e.o.DB, func(tx pgx.Tx) error {
			as, err := inbox.Unshipped(ctx, tx, e.o.ConsumerID, now().Add(-e.o.ShipDelay), shipBatch)
			if err != nil || len(as) == 0 {
				return err
			}
			lctx, cancel := context.WithTimeout(ctx, e.o.LedgerBudget)
			defer cancel()
			if err := e.o.Ledger.RecordAttempts(lctx, ledgerAttempts(as)); err != nil {
				return fmt.Errorf("consume: ship attempts: %w", err)
			}
			n = len(as)
			return inbox.Shipped(ctx, tx, as)
		})
		if err != nil {
			return rep, err
		}
		rep.Shipped += n
		if n < shipBatch {
			return rep, nil
		}
	}
	rep.More = true
	return rep, nil
}

// Close ships the attempts still queued, within ctx; what it cuts, Ship
// records later.
func (e *Engine) Close(ctx context.Context) error {
	if e.ships == nil {
		return nil
	}
	return errors.Join(e.ships.Close(ctx), e.marks.Close(ctx))
}

// FlushLedger waits until the attempts queued so far have been shipped (or
// tried) and marked shipped in Postgres, or ctx ends.
func (e *Engine) FlushLedger(ctx context.Context) error {
	if e.ships == nil {
		return nil
	}
	if err := e.ships.Flush(ctx); err != nil {
		return err
	}
	return e.marks.Flush(ctx)
}
