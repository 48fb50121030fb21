package projection

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/relaybus/relaybus/internal/ledger/model"

	"github.com/jackc/pgx/v5"

	"github.com/relaybus/relaybus/internal/inbox"
	"github.com/relaybus/relaybus/internal/logging"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/event"
)

// DefaultGapTimeout is how long a gap may stay open before it is reported
// (StrictOptions.GapTimeout): above Pub/Sub's longest backoff (600 s), so a
// predecessor that is merely being redelivered is not reported.
const DefaultGapTimeout = 10 * time.Minute

// StrictOptions configure a Resequencer.
type StrictOptions struct {
	// GapTimeout is how long the oldest event parked behind a gap may wait
	// before Check reports the gap (DefaultGapTimeout).
	GapTimeout time.Duration
	// Now is the clock parked events and the gap timeout are measured with
	// (time.Now).
	Now func() time.Time
	// Logger receives the resequencer's logs (logging.Discard when nil).
	Logger *slog.Logger
}

// Resequencer is the strict handler: it applies every version of an
// aggregate exactly in order (last + 1), whatever order delivery brings
// them in, and runs next for each in the transaction that applies it.
//
// Per delivery, in the delivery's transaction, after the aggregate's
// position row is locked (relaybus_strict_position; every transaction that
// touches an aggregate takes that lock first, so they run one at a time
// per aggregate):
//
//   - the next version (last + 1): applied (next runs, the position moves),
//     then every parked event that is now next, in order, each as an
//     attempt of its own (consumer.Context.ApplyOther: a success attempt
//     recorded in the same transaction and shipped to the ledger after the
//     commit); 200, outcome success;
//   - a later version: parked (relaybus_strict_parked: the event's JSON
//     envelope and its delivery's facts) and acknowledged; 200, outcome
//     parked. The inbox keeps it, so a redelivery is a duplicate;
//   - an earlier version: applied before under another event id (200,
//     success, no effect), or skipped by an operator (200, outcome failed,
//     code version_skipped).
//
// Nothing is asked to be redelivered or dead-lettered for arriving early.
// A parked event whose handler fails when its turn comes is settled as a
// delivery would be: a permanent error (or poison, dead-lettered) is
// recorded and the event released from the inbox, so the gap stays at its
// version until it is re-pushed or skipped; a transient error leaves it
// parked for Check to try again.
//
// A gap whose oldest parked event has waited longer than GapTimeout is
// reported once per missing version by Check (consume's POST /gaps:check,
// a Scheduler job every minute): an ERROR log "consume: version gap past
// its time", a stalled attempt in the ledger for every event parked behind
// it, and the count in Check's report and Stalled. An operator lists gaps
// (Gaps, POST /gaps) and releases one by delivering the missing version
// again (dlqreplay's replay of its dead letter, or a re-push of its event
// id) or by skipping it (Skip, POST /gaps:skip), which applies the parked
// events that are now next, in order, in the same transaction.
type Resequencer struct {
	next    consumer.Handler
	o       StrictOptions
	stalled atomic.Int64
}

// Strict returns a Resequencer with the default options that runs next
// for every version in order (next may be nil: positions only).
func Strict(next consumer.Handler) *Resequencer { return NewStrict(next, StrictOptions{}) }

// NewStrict returns a Resequencer with options o that runs next for every
// version in order. next may be nil for a Resequencer that only lists gaps
// and records skips outside the consumer (the operations API, dlqreplay):
// its Skip moves the position and leaves the parked versions that are now
// next to the consumer's own Check, which applies them with its handler.
func NewStrict(next consumer.Handler, o StrictOptions) *Resequencer {
	if o.GapTimeout <= 0 {
		o.GapTimeout = DefaultGapTimeout
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = logging.Discard()
	}
	return &Resequencer{next: next, o: o}
}

// GapTimeout is how long a gap may stay open before Check reports it.
func (r *Resequencer) GapTimeout() time.Duration { return r.o.GapTimeout }

// Stalled is how many gaps this Resequencer has reported past the gap
// timeout since it was made.
func (r *Resequencer) Stalled() int64 { return r.stalled.Load() }

func (r *Resequencer) now() time.Time { return r.o.Now().UTC() }

// positionKey is the transaction's value (consumer.Context.TxValue) that
// holds an aggregate's strict position once this transaction has locked
// it: the version it is at now.
type positionKey struct{ aggType, aggID string }

// Handle applies, parks or acknowledges c's event (see Resequencer). The
// aggregate's position is locked once per transaction: the events of a
// pack after the first find it in the transaction's values.
func (r *Resequencer) Handle(ctx context.Context, c *consumer.Context) error {
	e := c.Event
	key := positionKey{e.AggregateType, e.AggregateID}
	var pos int64
	var err error
	if last, locked := c.TxValue(key).(int64); locked {
		pos, err = r.handleAt(ctx, c, last)
	} else {
		pos, err = r.lockAndHandle(ctx, c)
	}
	if err == nil {
		c.SetTxValue(key, pos)
	}
	return err
}

// lockAndHandle locks the position of c's event's aggregate and handles
// the event, returning the position after it. An aggregate's first event
// (version 1, no position yet) creates the position at its own version,
// so it is applied without a second write of the row.
func (r *Resequencer) lockAndHandle(ctx context.Context, c *consumer.Context) (int64, error) {
	e := c.Event
	p, err := lockPosition(ctx, c.Tx, c.ConsumerID, e.AggregateType, e.AggregateID, e.Version, e.ID)
	if err != nil {
		return 0, err
	}
	if !p.atEvent {
		return r.handleAt(ctx, c, p.last)
	}
	return r.drainAfter(ctx, c, p.nextParked, r.run(ctx, c))
}

// handleAt handles c's event with its aggregate's position locked at last
// and returns the position after it.
func (r *Resequencer) handleAt(ctx context.Context, c *consumer.Context, last int64) (int64, error) {
	e := c.Event
	switch {
	case e.Version <= last:
		var skipped bool
		if err := c.Tx.QueryRow(ctx, skippedSQL, c.ConsumerID, e.AggregateType, e.AggregateID, e.Version).Scan(&skipped); err != nil {
			return last, consumer.Transient("database", fmt.Errorf("strict: skipped versions: %w", err))
		}
		if skipped {
			return last, consumer.Permanent("version_skipped", fmt.Errorf("version %d of %s/%s was skipped by an operator (POST /gaps:skip); not applied",
				e.Version, e.AggregateType, e.AggregateID))
		}
		return last, nil // applied before, under another event id
	case e.Version > last+1:
		return last, r.park(ctx, c, last)
	}
	nextParked, err := r.advance(ctx, c)
	return r.drainAfter(ctx, c, nextParked, err)
}

// drainAfter follows c's event, applied with err: when it succeeded and
// the version after it is parked, it applies the parked versions that are
// now next. It returns the position after them.
func (r *Resequencer) drainAfter(ctx context.Context, c *consumer.Context, nextParked bool, err error) (int64, error) {
	e := c.Event
	if err != nil || !nextParked {
		return e.Version, err
	}
	applied, err := r.drain(ctx, c, e.AggregateType, e.AggregateID, e.Version)
	if len(applied) > 0 {
		return applied[len(applied)-1], err
	}
	return e.Version, err
}

// lockedPosition is what lockPosition found.
type lockedPosition struct {
	// last is the last version applied.
	last int64
	// atEvent: the position was created at the version of the event
	// handled (its aggregate's first), so that event is applied as far as
	// the position goes.
	atEvent bool
	// nextParked: with atEvent, the version after it is parked.
	nextParked bool
}

// lockPosition locks the aggregate's position row, creating it when the
// aggregate has none, at version (the event handled) when version is 1
// and at 0 otherwise (version 0: no event).
func lockPosition(ctx context.Context, tx pgx.Tx, consumerID, aggType, aggID string, version int64, eventID string) (lockedPosition, error) {
	var p lockedPosition
	if err := tx.QueryRow(ctx, positionSQL, consumerID, aggType, aggID, version, eventID).Scan(&p.last, &p.atEvent, &p.nextParked); err != nil {
		return p, consumer.Transient("database", fmt.Errorf("strict position: %w", err))
	}
	return p, nil
}

// apply moves the position to c's event and runs next.
func (r *Resequencer) apply(ctx context.Context, c *consumer.Context) error {
	_, err := r.advance(ctx, c)
	return err
}

// advance moves the position to c's event, runs next, and reports whether
// the version after it is parked (so whether a drain has anything to
// apply).
func (r *Resequencer) advance(ctx context.Context, c *consumer.Context) (nextParked bool, err error) {
	e := c.Event
	if err := c.Tx.QueryRow(ctx, advanceSQL, c.ConsumerID, e.AggregateType, e.AggregateID, e.Version, e.ID).Scan(&nextParked); err != nil {
		return false, consumer.Transient("database", fmt.Errorf("strict position: %w", err))
	}
	return nextParked, r.run(ctx, c)
}

// run runs next for c's event, whose position has moved.
func (r *Resequencer) run(ctx context.Context, c *consumer.Context) error {
	if r.next == nil {
		return nil
	}
	return r.next.Handle(ctx, c)
}

// park stores c's event until its predecessor is applied.
func (r *Resequencer) park(ctx context.Context, c *consumer.Context, last int64) error {
	e := c.Event
	body, err := json.Marshal(e)
	if err != nil {
		return consumer.Poison("unencodable", fmt.Errorf("strict: park: %w", err))
	}
	var holder string
	var parked bool
	if err := c.Tx.QueryRow(ctx, parkSQL, c.ConsumerID, e.AggregateType, e.AggregateID, e.Version, e.ID, string(body), // text: see Latest
		e.Topic, c.Subscription, c.MessageID, c.DeliveryAttempt, r.now()).Scan(&holder, &parked); err != nil {
		return consumer.Transient("database", fmt.Errorf("strict: park: %w", err))
	}
	if !parked && holder != e.ID {
		return consumer.Permanent("version_taken", fmt.Errorf("version %d of %s/%s is already parked as event %s",
			e.Version, e.AggregateType, e.AggregateID, holder))
	}
	c.Park("gap", fmt.Sprintf("version %d arrived before version %d (last applied: %d); parked until the missing versions are applied",
		e.Version, last+1, last))
	return nil
}

// drainBatch bounds one read of parked events.
const drainBatch = 100

type parkedRow struct {
	version             int64
	eventID             string
	body                []byte
	subscription, msgID string
	deliveryAttempt     int
}

// drain applies the parked events of an aggregate that follow pos without
// a gap, in order, each as an attempt of its own in c's transaction, and
// returns the versions it applied. It stops at a gap, or at a parked event
// whose handler failed (see Resequencer).
func (r *Resequencer) drain(ctx context.Context, c *consumer.Context, aggType, aggID string, pos int64) ([]int64, error) {
	var applied []int64
	for {
		rows, err := c.Tx.Query(ctx, parkedSQL, c.ConsumerID, aggType, aggID, pos, drainBatch)
		if err != nil {
			return applied, consumer.Transient("database", fmt.Errorf("strict: parked events: %w", err))
		}
		ps, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (parkedRow, error) {
			var p parkedRow
			err := row.Scan(&p.version, &p.eventID, &p.body, &p.subscription, &p.msgID, &p.deliveryAttempt)
			return p, err
		})
		if err != nil {
			return applied, consumer.Transient("database", fmt.Errorf("strict: parked events: %w", err))
		}
		for _, p := range ps {
			if p.version != pos+1 {
				return applied, nil
			}
			ok, err := r.applyParked(ctx, c, aggType, aggID, p)
			if err != nil || !ok {
				return applied, err
			}
			pos = p.version
			applied = append(applied, p.version)
		}
		if len(ps) < drainBatch {
			return applied, nil
		}
	}
}

// applyParked applies one parked event whose turn has come and reports
// whether it was applied.
func (r *Resequencer) applyParked(ctx context.Context, c *consumer.Context, aggType, aggID string, p parkedRow) (bool, error) {
	log := r.o.Logger.With("consumer_id", c.ConsumerID, "aggregate_type", aggType, "aggregate_id", aggID,
		"version", p.version, "event_id", p.eventID)
	unpark := func() error {
		if _, err := c.Tx.Exec(ctx, unparkSQL, c.ConsumerID, aggType, aggID, p.version); err != nil {
			return consumer.Transient("database", fmt.Errorf("strict: unpark: %w", err))
		}
		return nil
	}
	var ev event.Event
	if err := json.Unmarshal(p.body, &ev); err != nil {
		// Written by park from a decoded event: cannot happen short of a
		// hand-edited row. Record it and let the gap stay.
		if _, err := c.RecordAttempt(ctx, inbox.Attempt{EventID: p.eventID, Outcome: string(model.OutcomeFailed),
			ErrorCode: "parked_unreadable", ErrorMessage: err.Error(), Subscription: p.subscription, MessageID: p.msgID}); err != nil {
			return false, consumer.Transient("database", err)
		}
		log.ErrorContext(ctx, "consume: a parked event cannot be read; released", "error", err.Error())
		return false, unpark()
	}
	outcome, herr := c.ApplyOther(ctx, &ev, consumer.Via{Subscription: p.subscription, MessageID: p.msgID, DeliveryAttempt: p.deliveryAttempt},
		consumer.HandlerFunc(func(ctx context.Context, oc *consumer.Context) error { return r.apply(ctx, oc) }))
	switch outcome {
	case "":
		return false, herr // the attempt could not be recorded: the transaction fails
	case model.OutcomeSuccess:
		return true, unpark()
	case model.OutcomeRetry:
		log.WarnContext(ctx, "consume: a parked event's turn came but its handler failed; it stays parked and POST /gaps:check tries again",
			"error", herr.Error())
		return false, nil
	}
	log.ErrorContext(ctx, "consume: a parked event's turn came and it failed for good; released, the gap stays at its version",
		"outcome", string(outcome), "error", herr.Error())
	return false, unpark()
}

// Runner runs f in one transaction of the consumer's database with a
// consumer.Context and ships what f recorded after the commit
// (consumer.Engine.Do).
type Runner interface {
	Do(ctx context.Context, f func(ctx context.Context, c *consumer.Context) error) error
}

// Gap is an aggregate whose next version has not been applied while later
// ones wait parked.
type Gap struct {
	AggregateType string `json:"aggregateType"`
	AggregateID   string `json:"aggregateId"`
	// Applied is the last version applied or skipped (0: none yet).
	Applied int64 `json:"applied"`
	// Missing is the first version not applied: Applied + 1.
	Missing int64 `json:"missing"`
	// FirstParked is the lowest parked version: versions Missing to
	// FirstParked - 1 have not arrived. When it equals Missing, the next
	// version is here but its handler failed (a transient error): Check
	// tries it again.
	FirstParked int64 `json:"firstParked"`
	// Parked is how many events wait behind the gap.
	Parked int `json:"parked"`
	// Since is when the oldest of them was parked; Age is how long ago.
	Since time.Time `json:"since"`
	Age   string    `json:"age"`
	// Overdue: Age is past the gap timeout.
	Overdue bool `json:"overdue"`
	// Reported: Check has reported this gap (stalled attempts recorded for
	// the missing version).
	Reported bool `json:"reported"`
}

// GapFilter narrows Gaps to one aggregate ("" matches any).
type GapFilter struct {
	AggregateType string `json:"aggregateType,omitempty"`
	AggregateID   string `json:"aggregateId,omitempty"`
	// Limit bounds the answer (DefaultGapLimit).
	Limit int `json:"limit,omitempty"`
}

// DefaultGapLimit bounds Gaps and one Check.
const DefaultGapLimit = 1000

// Gaps lists the open gaps, oldest first.
func (r *Resequencer) Gaps(ctx context.Context, run Runner, f GapFilter) ([]Gap, error) {
	var gaps []Gap
	err := run.Do(ctx, func(ctx context.Context, c *consumer.Context) error {
		var err error
		gaps, err = r.gaps(ctx, c, f)
		return err
	})
	return gaps, err
}

func (r *Resequencer) gaps(ctx context.Context, c *consumer.Context, f GapFilter) ([]Gap, error) {
	if f.Limit <= 0 || f.Limit > DefaultGapLimit {
		f.Limit = DefaultGapLimit
	}
	rows, err := c.Tx.Query(ctx, gapsSQL, c.ConsumerID, f.Limit, f.AggregateID, f.AggregateType)
	if err != nil {
		return nil, fmt.Errorf("strict: gaps: %w", err)
	}
	now := r.now()
	gaps, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Gap, error) {
		var g Gap
		err := row.Scan(&g.AggregateType, &g.AggregateID, &g.Applied, &g.FirstParked, &g.Parked, &g.Since, &g.Reported)
		g.Missing = g.Applied + 1
		g.Since = g.Since.UTC()
		age := now.Sub(g.Since)
		g.Age = age.Round(time.Second).String()
		g.Overdue = age >= r.o.GapTimeout
		return g, err
	})
	if err != nil {
		return nil, fmt.Errorf("strict: gaps: %w", err)
	}
	return gaps, nil
}

// CheckReport says what Check did.
type CheckReport struct {
	// Gaps is how many open gaps it looked at.
	Gaps int `json:"gaps"`
	// Applied is how many parked events it applied (their turn had come,
	// but their handler had failed before).
	Applied int `json:"applied"`
	// Stalled is how many gaps it reported past the gap timeout now.
	Stalled int `json:"stalled"`
	// StalledTotal is how many gaps this instance has reported since it
	// started.
	StalledTotal int64 `json:"stalledTotal"`
	// More is true when there were more gaps than one check looks at.
	More bool `json:"more"`
}

// Check looks at every open gap: it applies the parked events whose turn
// has come (after a transient failure of their handler), and reports once
// every gap whose oldest parked event has waited longer than the gap
// timeout: an ERROR log "consume: version gap past its time", a stalled
// attempt for every event parked behind it (shipped to the ledger), and
// the count. Each aggregate is handled in a transaction of its own, under
// its position lock. Consume serves it at POST /gaps:check.
func (r *Resequencer) Check(ctx context.Context, run Runner) (CheckReport, error) {
	var rep CheckReport
	gaps, err := r.Gaps(ctx, run, GapFilter{})
	if err != nil {
		return rep, err
	}
	rep.Gaps, rep.More = len(gaps), len(gaps) == DefaultGapLimit
	for _, g := range gaps {
		if g.FirstParked != g.Missing && (g.Reported || !g.Overdue) {
			continue // waiting, and not past its time (or reported already)
		}
		err := run.Do(ctx, func(ctx context.Context, c *consumer.Context) error {
			p, err := lockPosition(ctx, c.Tx, c.ConsumerID, g.AggregateType, g.AggregateID, 0, "")
			if err != nil {
				return err
			}
			applied, err := r.drain(ctx, c, g.AggregateType, g.AggregateID, p.last)
			if err != nil {
				return err
			}
			rep.Applied += len(applied)
			cur, err := r.gaps(ctx, c, GapFilter{AggregateType: g.AggregateType, AggregateID: g.AggregateID, Limit: 1})
			if err != nil || len(cur) == 0 || !cur[0].Overdue || cur[0].Reported {
				return err
			}
			if err := r.stall(ctx, c, cur[0]); err != nil {
				return err
			}
			rep.Stalled++
			return nil
		})
		if err != nil {
			return rep, err
		}
	}
	rep.StalledTotal = r.stalled.Load()
	return rep, nil
}

// stall reports a gap past its time: a stalled attempt for every event
// parked behind it, and the ERROR log.
func (r *Resequencer) stall(ctx context.Context, c *consumer.Context, g Gap) error {
	rows, err := c.Tx.Query(ctx, stallSQL, c.ConsumerID, g.AggregateType, g.AggregateID, g.Missing)
	if err != nil {
		return consumer.Transient("database", fmt.Errorf("strict: stall: %w", err))
	}
	type marked struct {
		version                    int64
		eventID, topic, sub, msgID string
		deliveryAttempt            int
	}
	ms, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (marked, error) {
		var m marked
		err := row.Scan(&m.version, &m.eventID, &m.topic, &m.sub, &m.msgID, &m.deliveryAttempt)
		return m, err
	})
	if err != nil {
		return consumer.Transient("database", fmt.Errorf("strict: stall: %w", err))
	}
	for _, m := range ms {
		msg := fmt.Sprintf("version %d of %s/%s has been missing since %s, longer than the gap timeout (%s); this event (version %d) waits behind it: "+
			"deliver the missing version again (replay or re-push it) or skip it (POST /gaps:skip)",
			g.Missing, g.AggregateType, g.AggregateID, g.Since.Format(time.RFC3339), r.o.GapTimeout, m.version)
		if _, err := c.RecordAttempt(ctx, inbox.Attempt{EventID: m.eventID, Outcome: string(model.OutcomeStalled), ErrorCode: "gap_timeout",
			ErrorMessage: msg, Topic: m.topic, Subscription: m.sub, MessageID: m.msgID, DeliveryAttempt: m.deliveryAttempt}); err != nil {
			return consumer.Transient("database", err)
		}
	}
	r.stalled.Add(1)
	r.o.Logger.ErrorContext(ctx, "consume: version gap past its time", "consumer_id", c.ConsumerID,
		"aggregate_type", g.AggregateType, "aggregate_id", g.AggregateID, "missing_version", g.Missing,
		"first_parked", g.FirstParked, "parked", g.Parked, "since", g.Since, "gap_timeout", r.o.GapTimeout.String(),
		"stalled_attempts", len(ms))
	return nil
}

// SkipRequest asks to release a gap by skipping missing versions.
type SkipRequest struct {
	// AggregateType may be left out when one aggregate type has a gap for
	// AggregateID.
	AggregateType string `json:"aggregateType,omitempty"`
	AggregateID   string `json:"aggregateId"`
	// Version is the first missing version (the gap's Missing).
	Version int64 `json:"version"`
	// Through is the last version to skip (Version when 0); it must be
	// below the lowest parked version.
	Through int64  `json:"through,omitempty"`
	Reason  string `json:"reason,omitempty"`
	// By names the operator (recorded with the skipped versions).
	By string `json:"-"`
}

// SkipResult says what Skip did.
type SkipResult struct {
	AggregateType string `json:"aggregateType"`
	AggregateID   string `json:"aggregateId"`
	// Skipped are the versions released without being applied.
	Skipped []int64 `json:"skipped"`
	// Applied are the parked versions applied after them, in order.
	Applied []int64 `json:"applied"`
	// Gap is what is still open for the aggregate, if anything.
	Gap *Gap `json:"gap,omitempty"`
}

// GapError is a refused release: Code is machine-readable, Message says
// the rule.
type GapError struct {
	Code, Message string
}

// Error returns the code and the message.
func (e *GapError) Error() string { return e.Code + ": " + e.Message }

// Skip releases a gap: it records versions Version..Through of the
// aggregate as skipped (never applied; a late delivery of one is
// acknowledged as a permanent failure, version_skipped), moves the
// position past them, and applies the parked events that are now next, in
// order, each with its success attempt, in one transaction under the
// aggregate's position lock. Version must be the first missing version and
// Through below the lowest parked version, or it answers a *GapError.
func (r *Resequencer) Skip(ctx context.Context, run Runner, req SkipRequest) (SkipResult, error) {
	res := SkipResult{AggregateType: req.AggregateType, AggregateID: req.AggregateID}
	if req.AggregateID == "" || req.Version < 1 {
		return res, &GapError{"invalid", "aggregateId and version (the first missing version, >= 1) are required"}
	}
	if req.Through == 0 {
		req.Through = req.Version
	}
	if req.Through < req.Version {
		return res, &GapError{"invalid", fmt.Sprintf("through (%d) must be at least version (%d)", req.Through, req.Version)}
	}
	if req.AggregateType == "" {
		gaps, err := r.Gaps(ctx, run, GapFilter{AggregateID: req.AggregateID, Limit: 2})
		if err != nil {
			return res, err
		}
		if len(gaps) != 1 {
			return res, &GapError{"aggregate_type", fmt.Sprintf("%d aggregate types have a gap for %s: name aggregateType", len(gaps), req.AggregateID)}
		}
		req.AggregateType, res.AggregateType = gaps[0].AggregateType, gaps[0].AggregateType
	}
	err := run.Do(ctx, func(ctx context.Context, c *consumer.Context) error {
		p, err := lockPosition(ctx, c.Tx, c.ConsumerID, req.AggregateType, req.AggregateID, 0, "")
		if err != nil {
			return err
		}
		last := p.last
		if req.Version != last+1 {
			return &GapError{"not_missing", fmt.Sprintf("version %d of %s/%s is not the first missing version: %d is (last applied: %d)",
				req.Version, req.AggregateType, req.AggregateID, last+1, last)}
		}
		cur, err := r.gaps(ctx, c, GapFilter{AggregateType: req.AggregateType, AggregateID: req.AggregateID, Limit: 1})
		if err != nil {
			return err
		}
		if len(cur) == 1 && req.Through >= cur[0].FirstParked {
			return &GapError{"parked", fmt.Sprintf("version %d of %s/%s is parked, not missing: skip versions %d to %d at most",
				cur[0].FirstParked, req.AggregateType, req.AggregateID, req.Version, cur[0].FirstParked-1)}
		}
		if _, err := c.Tx.Exec(ctx, skipSQL, c.ConsumerID, req.AggregateType, req.AggregateID, req.Version, req.Through, req.By, req.Reason); err != nil {
			return fmt.Errorf("strict: skip: %w", err)
		}
		if _, err := c.Tx.Exec(ctx, advanceSQL, c.ConsumerID, req.AggregateType, req.AggregateID, req.Through, ""); err != nil {
			return fmt.Errorf("strict: skip: %w", err)
		}
		for v := req.Version; v <= req.Through; v++ {
			res.Skipped = append(res.Skipped, v)
		}
		if r.next != nil {
			res.Applied, err = r.drain(ctx, c, req.AggregateType, req.AggregateID, req.Through)
			if err != nil {
				return err
			}
		}
		left, err := r.gaps(ctx, c, GapFilter{AggregateType: req.AggregateType, AggregateID: req.AggregateID, Limit: 1})
		if err == nil && len(left) == 1 {
			res.Gap = &left[0]
		}
		r.o.Logger.WarnContext(ctx, "consume: gap released by skipping versions", "consumer_id", c.ConsumerID,
			"aggregate_type", req.AggregateType, "aggregate_id", req.AggregateID, "skipped_from", req.Version,
			"skipped_through", req.Through, "applied", len(res.Applied), "by", req.By, "reason", req.Reason)
		return err
	})
	var ge *GapError
	if errors.As(err, &ge) {
		return res, ge
	}
	if res.Skipped == nil {
		res.Skipped = []int64{}
	}
	if res.Applied == nil {
		res.Applied = []int64{}
	}
	return res, err
}
