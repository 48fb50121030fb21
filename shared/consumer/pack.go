package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/relaybus/relaybus/internal/cloudevent"
	"github.com/relaybus/relaybus/internal/delivery"
	"github.com/relaybus/relaybus/internal/inbox"
	"github.com/relaybus/relaybus/internal/ledger/model"
	"github.com/relaybus/relaybus/internal/names"
	"github.com/relaybus/relaybus/internal/pack"
	"github.com/relaybus/relaybus/internal/telemetry"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/topology"
)

// CodePackUnfinished is Result.Code of a pack whose time ran out before
// all its events were handled one at a time: redelivered, it goes on from
// the first event not handled.
const CodePackUnfinished = "pack_unfinished"

// handlePack handles a pack (internal/pack: consecutive re-pushes of one
// aggregate addressed to this consumer, as a backfill sends them): its
// events in order, each exactly as a delivery of its own would be handled,
// and answers 200 once every one of them is settled.
//
// With a handler that runs in the consumer's transaction, the whole pack
// is tried first in one transaction: the events claimed in the inbox
// (together, in one round trip, unless a side-by-side change is among
// them; duplicates skipped), each handled, parked or applied in order, and
// the attempts committed together. Anything that would not be
// a plain success or park there (a handler's error, a database error, an
// event that does not decode or travels by claim check, the transaction's
// share of the pack's time running out) rolls that transaction back, and
// the events are handled one at a time instead (a Remote handler always
// is): the first that does not settle (503) stops the pack and is the
// answer, with no attempt number (the pack's deliveries are what the
// broker counts), so the broker delivers the pack again and the events
// before it are duplicates then.
//
// A pack has Options.Timeout in all: half for its transaction, the rest
// for the events one at a time, where no event is started once it is
// spent and one was handled (not a duplicate), except at the pack's last
// delivery attempt; the answer is then 503 pack_unfinished, and each
// redelivery goes on from the first event not handled. At the pack's last
// delivery attempt, an event whose transient failure is recorded as
// dead-lettered is published to the dead-letter topic alone, as a poison
// event is, and the rest of the pack goes on: the broker would otherwise
// dead-letter the whole pack.
func (e *Engine) handlePack(ctx context.Context, log *slog.Logger, d delivery.Delivery, sub string) Result {
	msgs, err := pack.Decode(d.Message)
	if err != nil {
		return e.undecodable(ctx, log, d, sub, event.ReasonMalformed, err)
	}
	start := time.Now()
	if _, remote := e.o.Handler.(Remote); !remote {
		if res, ok := e.attemptPack(ctx, log, d, sub, msgs, start.Add(e.o.Timeout/2)); ok {
			return res
		}
	}
	deadline := start.Add(e.o.Timeout)
	last := d.Message.DeliveryAttempt >= e.o.MaxDeliveryAttempts
	res := Result{Status: http.StatusOK, Outcome: model.OutcomeSuccess, Packed: len(msgs)}
	handled := false // an event not a duplicate: this delivery made progress
	for i, m := range msgs {
		if !last && handled && time.Now().After(deadline) {
			log.WarnContext(ctx, "consume: a pack's time ran out; the rest on its redelivery", "done", i, "events", len(msgs))
			return Result{Status: http.StatusServiceUnavailable, Packed: len(msgs), Code: CodePackUnfinished,
				Error: fmt.Sprintf("%d of the pack's %d events handled within %s; the rest on its redelivery", i, len(msgs), e.o.Timeout)}
		}
		md := d
		md.Message = m
		r := e.Handle(ctx, md) // each event's own span and metrics
		handled = handled || !r.Duplicate
		if r.Status < 300 {
			continue
		}
		if topic := md.Topic(); r.Outcome == model.OutcomeDeadLettered && topic != "" {
			if err := e.deadLetter(ctx, md, sub, topic, r.Code, errors.New(r.Error)); err == nil {
				log.ErrorContext(ctx, "consume: an event of a pack dead-lettered at the pack's last delivery attempt",
					"event_id", r.EventID, "code", r.Code, "error", r.Error)
				continue
			}
		}
		r.Packed, r.Attempt = len(msgs), 0
		r.Error = fmt.Sprintf("event %d of a pack of %d: %s", i+1, len(msgs), r.Error)
		return r
	}
	return res
}

// packed is an event of a pack applied or parked in the pack's
// transaction: its attempt and its handler's Context.
type packed struct {
	a inbox.Attempt
	c *Context
}

// attemptPack handles the events of a pack in one transaction (see
// handlePack) and reports whether it did: false leaves nothing committed
// and the events to be handled one at a time.
func (e *Engine) attemptPack(ctx context.Context, log *slog.Logger, d delivery.Delivery, sub string, msgs []event.Message, deadline time.Time) (Result, bool) {
	evs := make([]*event.Event, len(msgs))
	for i, m := range msgs {
		if m.Attributes[event.AttrClaimCheck] != "" || m.Attributes[topology.TargetConsumerAttr] != e.o.ConsumerID {
			return Result{}, false
		}
		ev, _, err := cloudevent.Decode(m, e.o.Limits)
		if err != nil {
			return Result{}, false
		}
		evs[i] = &ev
	}
	start := time.Now()
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	tx, err := e.o.DB.Begin(ctx)
	if err != nil {
		return Result{}, false
	}
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer rcancel()
	defer tx.Rollback(rctx) //nolint:errcheck // after Commit this is a no-op
	var (
		done    []packed
		emitted []string
		dups    int
		values  = map[any]any{} // the Contexts' TxValues
	)
	as := make([]inbox.Attempt, len(evs))
	sideBySide := false
	for i, ev := range evs {
		as[i] = inbox.Attempt{ConsumerID: e.o.ConsumerID, EventID: ev.ID, Outcome: string(model.OutcomeSuccess),
			ConsumedAt: now(), Topic: ev.Topic, Subscription: sub, MessageID: msgs[i].ID,
			DeliveryAttempt: d.Message.DeliveryAttempt}
		_, v := event.ChangeOf(ev)
		sideBySide = sideBySide || v
	}
	// The events are claimed together, in one round trip, unless one is a
	// version of a side-by-side change: its handler (Mux) asks whether
	// another version is applied, and must see only the events handled
	// before it, as a delivery of its own would, so each is claimed just
	// before its handler runs.
	var bs []inbox.Begun
	if !sideBySide {
		if bs, err = inbox.BeginAppliedAll(ctx, tx, as); err != nil {
			return Result{}, false
		}
	}
	for i, ev := range evs {
		a := as[i]
		var b inbox.Begun
		if bs != nil {
			b = bs[i]
		} else if b, err = inbox.BeginApplied(ctx, tx, a); err != nil {
			return Result{}, false
		}
		if !b.Claimed {
			dups++
			continue
		}
		a.AttemptNo, a.Queued = b.Attempt, b.Queued
		c := &Context{Event: ev, Tx: tx, ConsumerID: e.o.ConsumerID, Attempt: b.Attempt, DeliveryAttempt: d.Message.DeliveryAttempt,
			Subscription: sub, MessageID: msgs[i].ID, engine: e, deferAtCommit: true, txValues: values}
		if err := e.runHandler(ctx, c); err != nil {
			return Result{}, false
		}
		if err := c.flushAtCommit(ctx); err != nil {
			return Result{}, false
		}
		if c.parkCode != "" {
			a.Outcome, a.ErrorCode, a.ErrorMessage = string(model.OutcomeParked), c.parkCode, c.parkMessage
			if err := inbox.Outcome(ctx, tx, a); err != nil {
				return Result{}, false
			}
		}
		emitted = append(emitted, c.emittedIDs...)
		done = append(done, packed{a: a, c: c})
	}
	var kicked func()
	if tk, ok := e.o.Kicker.(TxKicker); ok && len(emitted) > 0 {
		if kicked, err = tk.KickIn(ctx, tx, emitted...); err != nil {
			return Result{}, false
		}
	}
	if err := tx.Commit(ctx); err != nil {
		// Whether it committed or not, the events handled one at a time
		// find out: what did commit is a duplicate then.
		return Result{}, false
	}
	after := kicked
	if after != nil {
		after = func() {} // the pack's kick goes once, below
	}
	for _, p := range done {
		e.shipLater(ctx, log, p.a)
		e.afterCommit(ctx, log, p.c, after)
	}
	if kicked != nil {
		kicked()
	}
	if telemetry.Enabled() {
		took := time.Since(start) / time.Duration(len(msgs)) // each event's share of the pack's transaction
		short := names.ResourceID(sub)
		for _, p := range done {
			outcome := string(model.OutcomeSuccess)
			if p.c.parkCode != "" {
				outcome = string(model.OutcomeParked)
			}
			telemetry.RecordConsume(ctx, p.a.Topic, short, e.o.ConsumerID, outcome, took)
		}
	}
	log.InfoContext(ctx, "consume: pack applied", "events", len(msgs), "handled", len(done), "duplicates", dups)
	return Result{Status: http.StatusOK, Outcome: model.OutcomeSuccess, Packed: len(msgs), Duplicate: dups == len(msgs)}, true
}
