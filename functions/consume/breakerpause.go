package consume

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/relaybus/relaybus/internal/inbox"
	"github.com/relaybus/relaybus/shared/broker"
	"github.com/relaybus/relaybus/shared/forward"
	"github.com/relaybus/relaybus/shared/postgres"
	"github.com/relaybus/relaybus/shared/topology"
)

// The circuit breaker's pause of an ordered push consumer on Pub/Sub.
//
// Pub/Sub counts every pushed delivery that is not acknowledged toward the
// subscription's dead-letter policy, a breaker's held answer (503)
// included. So when a forward consumer's breaker opens, consume detaches
// its own subscription's push endpoint: the delivery control the
// operators' pause uses (broker.PushConfigurer, as dlqreplay's
// PushPauser). Pub/Sub then delivers nothing, counts nothing and keeps
// the messages in order until the endpoint is set back. The pause is
// recorded in the consumer's database as the breaker's
// (inbox.PauseByBreaker), with the push configuration it detached.
//
// A Cloud Scheduler job POSTs /breaker:probe every minute: once the
// breaker's cool-down has passed, consume probes the target
// (forward.Forwarder.ProbeTarget: FORWARD_PROBE, HEAD of FORWARD_URL by
// default) and, when it answers with anything the breaker does not call
// down, sets the endpoint back and lifts the record, in one transaction
// that holds the record's lock (inbox.ResumeBreakerPause). An operator's
// pause is never lifted by the probe: an operator who pauses a consumer
// the breaker paused takes the pause over, and an operator's resume lifts
// the breaker's pause too.

// breakerPause pauses and resumes a push consumer for its breaker. Its
// zero value is off (transition and held do nothing): Build turns it on
// for a forward consumer delivered by ordered push on a broker with push
// endpoints.
type breakerPause struct {
	breakerRuns
	db         pauseDB
	push       broker.PushConfigurer
	sub        string
	consumerID string
	fwd        *forward.Forwarder
	breaker    forward.BreakerOptions
	log        *slog.Logger
	now        func() time.Time
}

// breakerRuns is what both breaker pauses (breakerPause, breakerFlag) do
// alike: start the pause in the background when the breaker opens, one at
// a time, and wait for it at close; throttle the check a held delivery
// makes. Its zero value is off.
type breakerRuns struct {
	on bool
	// timeout bounds one pause or resume (the admin API and the record).
	timeout time.Duration

	pausing atomic.Bool
	checked atomic.Int64 // unix nanos of the last held check
	wg      sync.WaitGroup
}

// opened runs pause in the background, within timeout, when tr opens the
// breaker, unless off or a pause is running (the delivery that opened it
// is answered at once).
func (b *breakerRuns) opened(ctx context.Context, tr forward.Transition, pause func(context.Context)) {
	if !b.on || tr.To != forward.Open || !b.pausing.CompareAndSwap(false, true) {
		return
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		defer b.pausing.Store(false)
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.timeout)
		defer cancel()
		pause(pctx)
	}()
}

// checkHeld says whether a delivery fwd's breaker held should look now
// whether the pause stands: on, no pause running, the breaker not closed,
// and at most once every breakerCheckEvery.
func (b *breakerRuns) checkHeld(fwd *forward.Forwarder) bool {
	if !b.on || b.pausing.Load() || fwd.BreakerState() == forward.Closed {
		return false
	}
	now := time.Now().UnixNano()
	last := b.checked.Load()
	return now-last >= int64(breakerCheckEvery) && b.checked.CompareAndSwap(last, now)
}

// close waits for a pause in progress.
func (b *breakerRuns) close(context.Context) error {
	b.wg.Wait()
	return nil
}

// pauseDB is the consumer's database, where the pause is recorded.
type pauseDB interface {
	postgres.DBTX
	postgres.Beginner
}

// breakerCheckEvery bounds how often a held delivery makes consume look
// whether its breaker's pause still stands.
const breakerCheckEvery = time.Second

// transition is the forwarder's OnTransition: when the breaker opens, the
// subscription is paused, in the background (the delivery that opened it
// is answered at once).
func (p *breakerPause) transition(ctx context.Context, tr forward.Transition) {
	p.opened(ctx, tr, func(pctx context.Context) {
		if err := p.pause(pctx, tr); err != nil {
			p.log.ErrorContext(pctx, "consume: circuit breaker open, but the push subscription could not be paused; held deliveries count toward its dead-letter policy",
				"subscription", p.sub, "error", err.Error())
		}
	})
}

// pause detaches the push endpoint and records the breaker's pause, unless
// the subscription is paused already.
func (p *breakerPause) pause(ctx context.Context, tr forward.Transition) error {
	cur, err := p.push.PushEndpoint(ctx, p.sub)
	if err != nil {
		return fmt.Errorf("read the push endpoint of %s: %w", p.sub, err)
	}
	if cur.URL == "" {
		p.log.InfoContext(ctx, "consume: circuit breaker open; the push subscription is paused already", "subscription", p.sub)
		return nil
	}
	rec := inbox.PushPause{Subscription: p.sub, ConsumerID: p.consumerID, Endpoint: cur.URL, ServiceAccount: cur.ServiceAccount,
		Audience: cur.Audience, Reason: tr.Reason, ProbeAfter: p.now().Add(tr.CoolDown)}
	recorded, err := inbox.PauseByBreaker(ctx, p.db, rec)
	if err != nil {
		return err
	}
	if !recorded {
		had, ok, err := inbox.PushPauseOf(ctx, p.db, p.sub)
		if err != nil {
			return err
		}
		if ok && had.By == inbox.PausedByOperator {
			// An operator is pausing it: the endpoint goes with their pause.
			return nil
		}
		// The breaker's own record of a resume that did not finish: detach
		// again under it.
	}
	if _, err := p.push.SetPushEndpoint(ctx, p.sub, broker.PushEndpoint{}); err != nil {
		if recorded {
			_ = inbox.ClearPushPause(ctx, p.db, p.sub, inbox.PausedByBreaker)
		}
		return fmt.Errorf("detach the push endpoint of %s: %w", p.sub, err)
	}
	p.log.WarnContext(ctx, "consume: circuit breaker open; push subscription paused: nothing is delivered, no delivery attempt is counted, messages wait in order until the probe finds the target up",
		"subscription", p.sub, "reason", tr.Reason, "next_probe", rec.ProbeAfter.UTC().Format(time.RFC3339))
	return nil
}

// held is called after a delivery the breaker held: deliveries still come,
// so either the pause has not reached Pub/Sub yet, or it failed, or it was
// lifted (by the probe on another instance, or by an operator). With no
// pause recorded and the endpoint attached, the breaker's cool-down ends
// here, so that the next
// delivery probes the target: its success closes the breaker, its failure
// opens it again and pauses again. Checked at most once a second.
func (p *breakerPause) held(ctx context.Context) {
	if !p.checkHeld(p.fwd) {
		return
	}
	if _, ok, err := inbox.PushPauseOf(ctx, p.db, p.sub); err != nil || ok {
		return
	}
	// And the subscription pushes (on the local stack, whose delivery loop
	// pulls the subscription, it has no endpoint: the breaker keeps its
	// own cool-down there).
	if e, err := p.push.PushEndpoint(ctx, p.sub); err == nil && e.URL != "" {
		p.fwd.EndCoolDown()
	}
}

// probeReport is POST /breaker:probe's answer.
type probeReport struct {
	Subscription string `json:"subscription"`
	// Paused: the subscription's endpoint is detached; PausedBy says by
	// whom (breaker or operator).
	Paused   bool   `json:"paused"`
	PausedBy string `json:"pausedBy,omitempty"`
	// Breaker is this instance's breaker state.
	Breaker string `json:"breaker"`
	// Probed: the target was probed; Target says what it answered.
	Probed bool   `json:"probed"`
	Target string `json:"target,omitempty"`
	// NextProbe is when the breaker probes next, while it keeps the
	// subscription paused.
	NextProbe *time.Time `json:"nextProbe,omitempty"`
	Done      string     `json:"done"`
}

// probeStep is what the steps a breaker's probe takes before it resumes
// found: the same for the push pause and the flag pause.
type probeStep struct {
	// Up: the target answered and the consumer is to be resumed; when
	// false, Done says why not.
	Up bool
	// Probed: the target was probed; Target says what it answered.
	Probed bool
	Target string
	// NextProbe is when the breaker probes next, while it keeps the
	// consumer paused.
	NextProbe *time.Time
	Done      string
}

// probeUntilUp takes a breaker probe's steps up to the resume, for a pause
// recorded by whom (by, who), with its cool-down until probeAfter after
// failed probes: an operator's pause is left alone; nothing is probed
// before the cool-down ends; a target still down schedules the next probe
// (failed records it) and is logged, with attrs naming the consumer.
func probeUntilUp(ctx context.Context, fwd *forward.Forwarder, breaker forward.BreakerOptions, now time.Time, by, who string, probeAfter time.Time, failedProbes int,
	failed func(next time.Time, reason string) error, log *slog.Logger, what string, attrs ...any) (probeStep, error) {
	var st probeStep
	if by != inbox.PausedByBreaker {
		st.Done = "paused by an operator (" + who + "): the probe leaves it paused; an operator resumes it"
		return st, nil
	}
	if now.Before(probeAfter) {
		next := probeAfter.UTC()
		st.NextProbe = &next
		st.Done = "paused by the breaker; its cool-down runs until " + next.Format(time.RFC3339)
		return st, nil
	}
	res := fwd.ProbeTarget(ctx)
	st.Probed, st.Target = true, res.Reason
	if !res.Up {
		next := now.Add(breaker.CoolDownAfter(failedProbes+1, res.RetryAfter)).UTC()
		if err := failed(next, res.Reason); err != nil {
			return st, err
		}
		st.NextProbe = &next
		st.Done = "the target is still down (" + res.Reason + "): paused; next probe after " + next.Format(time.RFC3339)
		log.WarnContext(ctx, "consume: the breaker's probe found the target down; "+what+" stays paused",
			append(attrs, "reason", res.Reason, "next_probe", next.Format(time.RFC3339))...)
		return st, nil
	}
	st.Up = true
	return st, nil
}

// probe is POST /breaker:probe (a Scheduler job, every minute).
func (p *breakerPause) probe(ctx context.Context) (rep probeReport, err error) {
	rep.Subscription = p.sub
	defer func() { rep.Breaker = p.fwd.BreakerState().String() }()
	rec, ok, err := inbox.PushPauseOf(ctx, p.db, p.sub)
	if err != nil {
		return rep, err
	}
	if !ok {
		rep.Done = "not paused by the breaker: nothing to probe"
		return rep, nil
	}
	rep.Paused, rep.PausedBy = true, rec.By
	st, err := probeUntilUp(ctx, p.fwd, p.breaker, p.now(), rec.By, rec.Who, rec.ProbeAfter, rec.FailedProbes,
		func(next time.Time, reason string) error {
			return inbox.BreakerProbeFailed(ctx, p.db, p.sub, next, reason)
		},
		p.log, "the push subscription", "consumer_id", p.consumerID, "subscription", p.sub)
	rep.Probed, rep.Target, rep.NextProbe, rep.Done = st.Probed, st.Target, st.NextProbe, st.Done
	if err != nil || !st.Up {
		return rep, err
	}
	resumed, err := inbox.ResumeBreakerPause(ctx, p.db, p.sub, func(ctx context.Context, rec inbox.PushPause) error {
		_, err := p.push.SetPushEndpoint(ctx, p.sub, broker.PushEndpoint{URL: rec.Endpoint, ServiceAccount: rec.ServiceAccount, Audience: rec.Audience})
		if err != nil {
			return fmt.Errorf("set the push endpoint of %s back: %w", p.sub, err)
		}
		return nil
	})
	if err != nil {
		return rep, err
	}
	if !resumed {
		// An operator paused it meanwhile.
		rep.PausedBy = inbox.PausedByOperator
		rep.Done = "the target answers, but an operator paused the consumer meanwhile: left paused"
		return rep, nil
	}
	rep.Paused, rep.PausedBy = false, ""
	rep.Done = "the target answers (" + st.Target + "): the push endpoint was set back; delivery starts again with the oldest waiting message"
	p.log.InfoContext(ctx, "consume: the breaker's probe found the target up; push subscription resumed", "subscription", p.sub, "target", st.Target)
	return rep, nil
}

// serveProbe serves POST /breaker:probe.
func (p *breakerPause) serveProbe(w http.ResponseWriter, r *http.Request, log *slog.Logger) {
	if p == nil || !p.on {
		writeJSON(w, http.StatusNotFound, map[string]string{"code": "no_breaker_pause",
			"message": "this consumer has no breaker that pauses its delivery (a forward consumer delivered by ordered push on Pub/Sub, or by Eventarc, has)"})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), p.timeout)
	defer cancel()
	rep, err := p.probe(ctx)
	if err != nil {
		log.ErrorContext(ctx, "consume: the breaker's probe failed; the next run tries again", "subscription", p.sub, "error", err.Error())
		var be *broker.Error
		msg := "the probe failed; see the logs"
		if errors.As(err, &be) {
			msg = "the probe failed: " + be.Reason
		}
		writeJSON(w, http.StatusInternalServerError, map[string]any{"subscription": p.sub, "error": msg})
		return
	}
	writeJSON(w, http.StatusOK, rep)
}

// breakerPauseTimeout bounds one pause or probe.
const breakerPauseTimeout = 30 * time.Second

// breakerPauses turns bp on when the consumer is a forward consumer with a
// breaker, delivered by ordered push (the topology's delivery push, not
// CONSUMER_MODE=pull) on a broker whose push endpoints consume can set
// (Pub/Sub); it reports whether it did. Elsewhere the breaker holds
// deliveries as before: a pull worker keeps them leased, uncounted.
func breakerPauses(bp *breakerPause, h any, cfg Config, top *topology.Topology, b broker.Broker, pool pauseDB, log *slog.Logger) bool {
	fwd, ok := h.(*forward.Forwarder)
	if !ok || cfg.Mode == ModePull || cfg.ForwardBreakerThreshold < 0 {
		return false
	}
	c, ok := top.Consumer(cfg.Subscription)
	if !ok || c.Delivery != topology.DeliveryPush {
		return false
	}
	push, ok := broker.As[broker.PushConfigurer](b)
	if !ok {
		return false
	}
	bp.db, bp.push, bp.sub, bp.consumerID, bp.fwd, bp.log = pool, push, cfg.Subscription, cfg.ConsumerID, fwd, log
	bp.breaker = forward.BreakerOptions{Threshold: cfg.ForwardBreakerThreshold, CoolDown: cfg.ForwardBreakerCoolDown, MaxCoolDown: cfg.ForwardBreakerMaxCoolDown}
	bp.now, bp.timeout = time.Now, breakerPauseTimeout
	bp.on = true
	return true
}

// pushBreakerThreshold is the breaker's threshold: FORWARD_BREAKER_THRESHOLD,
// but over ordered push and Eventarc at most CONSUMER_MAX_DELIVERY_ATTEMPTS
// − 2 (and at least 1). Pub/Sub counts each of the failures before the
// breaker opens, the one that opens it included, so an event at the head of
// its ordering key (or one Eventarc redelivers again and again) meets them
// all: the cap leaves it one counted delivery after the pause, and one
// more, before its dead-letter policy is reached (with 5 attempts, Pub/Sub's
// least, the breaker opens at the 3rd failure).
func pushBreakerThreshold(cfg Config, top *topology.Topology, log *slog.Logger) int {
	t := cfg.ForwardBreakerThreshold
	if cfg.Handler != "forward" || cfg.Mode == ModePull || t < 0 || cfg.MaxDeliveryAttempts <= 0 {
		return t
	}
	if c, ok := top.Consumer(cfg.Subscription); !ok || (c.Delivery != topology.DeliveryPush && c.Delivery != topology.DeliveryEventarc) {
		return t
	}
	limit := max(1, cfg.MaxDeliveryAttempts-2)
	if t == 0 {
		t = forward.DefaultBreakerThreshold
	}
	if t > limit {
		log.Info("consume: over push and Eventarc the circuit breaker opens below the subscription's dead-letter threshold",
			"forward_breaker_threshold", t, "max_delivery_attempts", cfg.MaxDeliveryAttempts, "threshold", limit)
		return limit
	}
	return t
}
