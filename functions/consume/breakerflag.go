package consume

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/relaybus/relaybus/internal/inbox"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/forward"
	"github.com/relaybus/relaybus/shared/topology"
)

// The circuit breaker's pause of an Eventarc forward consumer.
//
// Eventarc owns its trigger's subscription, and Pub/Sub counts every
// delivery it pushes there that is not acknowledged toward the dead-letter
// policy, a breaker's held answer (503) included. So when the breaker of a
// forward consumer delivered by Eventarc opens, consume pauses the consumer
// by its own flag (the delivery control of the operators' pause for
// Eventarc, internal/inbox's pause.go), the flag's row marked as the
// breaker's (inbox.PauseFlagByBreaker): from then on every delivery is kept
// in the consumer's database and acknowledged, 200 with code paused, no
// attempt made or counted, however long the target stays down.
//
// The same Cloud Scheduler job as for push, POST /breaker:probe every
// minute: once the breaker's cool-down has passed, consume probes the
// target and, when it answers, lifts the breaker's row and publishes the
// kept deliveries again to the topic, oldest first, each addressed to this
// consumer alone (inbox.PublishHeld). A probe also publishes what a resume
// before it left kept (a delivery kept while the row was being lifted, a
// publish that failed). The operators' rules are the push pause's: the
// probe never lifts an operator's pause; an operator's pause takes the
// breaker's over; an operator's resume lifts it.
//
// Eventarc delivery is unordered, and so is this resume: the kept
// deliveries are published again oldest first, but a delivery that arrives
// after the row is lifted may be forwarded before an older one is
// delivered again.

// breakerFlag pauses and resumes an Eventarc forward consumer by its flag
// for its breaker. Its zero value is off.
type breakerFlag struct {
	breakerRuns
	db         pauseDB
	pub        event.Publisher
	pauses     *inbox.PauseFlags
	consumerID string
	topic      string
	fwd        *forward.Forwarder
	breaker    forward.BreakerOptions
	log        *slog.Logger
	now        func() time.Time
}

// transition is the forwarder's OnTransition: when the breaker opens, the
// consumer is paused by its flag, in the background (the delivery that
// opened it is answered at once).
func (p *breakerFlag) transition(ctx context.Context, tr forward.Transition) {
	p.opened(ctx, tr, func(pctx context.Context) {
		next := p.now().Add(tr.CoolDown)
		set, err := inbox.PauseFlagByBreaker(pctx, p.db, p.consumerID, p.topic, tr.Reason, next)
		if err != nil {
			p.log.ErrorContext(pctx, "consume: circuit breaker open, but the consumer could not be paused; held deliveries count toward its subscription's dead-letter policy",
				"consumer_id", p.consumerID, "topic", p.topic, "error", err.Error())
			return
		}
		p.pauses.Set(p.topic, true)
		if !set {
			p.log.InfoContext(pctx, "consume: circuit breaker open; the consumer is paused already", "consumer_id", p.consumerID, "topic", p.topic)
			return
		}
		p.log.WarnContext(pctx, "consume: circuit breaker open; consumer paused by its flag: deliveries are kept and acknowledged, no delivery attempt is spent, until the probe finds the target up",
			"consumer_id", p.consumerID, "topic", p.topic, "reason", tr.Reason, "next_probe", next.UTC().Format(time.RFC3339))
	})
}

// held is called after a delivery the breaker held: deliveries reach the
// engine, so the flag is not set (yet, or no longer: lifted by the probe
// on another instance, or by an operator). With no pause standing, the
// breaker's cool-down ends here, so that the next delivery probes the
// target. Checked at most once a second.
func (p *breakerFlag) held(ctx context.Context) {
	if !p.checkHeld(p.fwd) {
		return
	}
	if _, ok, err := inbox.FlagPauseOf(ctx, p.db, p.consumerID, p.topic); err == nil && !ok {
		p.fwd.EndCoolDown()
	}
}

// flagProbeReport is POST /breaker:probe's answer for a consumer paused by
// its flag.
type flagProbeReport struct {
	Consumer string `json:"consumer"`
	Topic    string `json:"topic"`
	// Paused: the consumer's flag stands; PausedBy says by whom (breaker
	// or operator).
	Paused   bool   `json:"paused"`
	PausedBy string `json:"pausedBy,omitempty"`
	// Breaker is this instance's breaker state.
	Breaker string `json:"breaker"`
	// Probed: the target was probed; Target says what it answered.
	Probed bool   `json:"probed"`
	Target string `json:"target,omitempty"`
	// NextProbe is when the breaker probes next, while it keeps the
	// consumer paused.
	NextProbe *time.Time `json:"nextProbe,omitempty"`
	// Republished is how many kept deliveries were published again.
	Republished int    `json:"republished"`
	Done        string `json:"done"`
}

// probe is POST /breaker:probe for a consumer paused by its flag.
func (p *breakerFlag) probe(ctx context.Context) (rep flagProbeReport, err error) {
	rep.Consumer, rep.Topic = p.consumerID, p.topic
	defer func() { rep.Breaker = p.fwd.BreakerState().String() }()
	rec, ok, err := inbox.FlagPauseOf(ctx, p.db, p.consumerID, p.topic)
	if err != nil {
		return rep, err
	}
	if !ok {
		// What a resume before left kept is published now.
		rep.Done = "not paused: nothing to probe"
		err = p.republish(ctx, &rep)
		return rep, err
	}
	rep.Paused, rep.PausedBy = true, rec.By
	st, err := probeUntilUp(ctx, p.fwd, p.breaker, p.now(), rec.By, rec.Who, rec.ProbeAfter, rec.FailedProbes,
		func(next time.Time, reason string) error {
			return inbox.FlagBreakerProbeFailed(ctx, p.db, p.consumerID, p.topic, next, reason)
		},
		p.log, "the consumer", "consumer_id", p.consumerID, "topic", p.topic)
	rep.Probed, rep.Target, rep.NextProbe, rep.Done = st.Probed, st.Target, st.NextProbe, st.Done
	if err != nil || !st.Up {
		return rep, err
	}
	resumed, err := inbox.ClearFlagBreakerPause(ctx, p.db, p.consumerID, p.topic)
	if err != nil {
		return rep, err
	}
	if !resumed {
		// An operator took the pause over meanwhile, or lifted it.
		if _, still, err := inbox.FlagPauseOf(ctx, p.db, p.consumerID, p.topic); err == nil && still {
			rep.PausedBy = inbox.PausedByOperator
			rep.Done = "the target answers, but an operator paused the consumer meanwhile: left paused"
			return rep, nil
		}
	}
	p.pauses.Set(p.topic, false)
	rep.Paused, rep.PausedBy = false, ""
	rep.Done = "the target answers (" + st.Target + "): the consumer's flag was lifted"
	p.log.InfoContext(ctx, "consume: the breaker's probe found the target up; consumer resumed", "consumer_id", p.consumerID, "topic", p.topic, "target", st.Target)
	err = p.republish(ctx, &rep)
	return rep, err
}

// republish publishes again what the pause kept, oldest first, addressed
// to this consumer alone.
func (p *breakerFlag) republish(ctx context.Context, rep *flagProbeReport) error {
	n, err := inbox.PublishHeld(ctx, p.db, p.pub, p.consumerID, p.topic, topology.TargetConsumerAttr)
	rep.Republished = n
	if n > 0 {
		rep.Done += fmt.Sprintf("; %d deliveries kept while paused were published again to %s, addressed to %s alone", n, p.topic, p.consumerID)
		p.log.InfoContext(ctx, "consume: deliveries kept while the breaker paused the consumer were published again", "consumer_id", p.consumerID, "topic", p.topic, "published", n)
	}
	if err != nil {
		return fmt.Errorf("%d kept deliveries published again, the rest are still kept (the next probe goes on): %w", n, err)
	}
	return nil
}

// serveProbe serves POST /breaker:probe.
func (p *breakerFlag) serveProbe(w http.ResponseWriter, r *http.Request, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(r.Context(), p.timeout)
	defer cancel()
	rep, err := p.probe(ctx)
	if err != nil {
		log.ErrorContext(ctx, "consume: the breaker's probe failed; the next run tries again", "consumer_id", p.consumerID, "topic", p.topic, "error", err.Error())
		writeJSON(w, http.StatusInternalServerError, map[string]any{"consumer": p.consumerID, "topic": p.topic, "republished": rep.Republished,
			"error": "the probe failed; see the logs"})
		return
	}
	writeJSON(w, http.StatusOK, rep)
}

// breakerFlags turns bf on when the consumer is a forward consumer with a
// breaker delivered by Eventarc (not CONSUMER_MODE=pull), paused by its
// flag (pauses); it reports whether it did.
func breakerFlags(bf *breakerFlag, h any, cfg Config, top *topology.Topology, pub event.Publisher, pool pauseDB, pauses *inbox.PauseFlags, log *slog.Logger) bool {
	fwd, ok := h.(*forward.Forwarder)
	if !ok || cfg.Mode == ModePull || cfg.ForwardBreakerThreshold < 0 || pauses == nil {
		return false
	}
	c, ok := top.Consumer(cfg.Subscription)
	if !ok || c.Delivery != topology.DeliveryEventarc {
		return false
	}
	bf.db, bf.pub, bf.pauses, bf.consumerID, bf.topic, bf.fwd, bf.log = pool, pub, pauses, cfg.ConsumerID, c.Topic, fwd, log
	bf.breaker = forward.BreakerOptions{Threshold: cfg.ForwardBreakerThreshold, CoolDown: cfg.ForwardBreakerCoolDown, MaxCoolDown: cfg.ForwardBreakerMaxCoolDown}
	bf.now, bf.timeout = time.Now, breakerPauseTimeout
	bf.on = true
	return true
}
