package dlqreplay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/relaybus/relaybus/internal/forwarders"
	"github.com/relaybus/relaybus/internal/inbox"
	"github.com/relaybus/relaybus/internal/ledger/audit"
	"github.com/relaybus/relaybus/shared/broker"
	"github.com/relaybus/relaybus/shared/topology"
)

// Pausing a consumer detaches its push subscription's endpoint. Pub/Sub:
// "An empty pushConfig indicates that the Pub/Sub system should stop pushing
// messages from the given subscription and allow messages to be pulled and
// acknowledged - effectively pausing the subscription if subscriptions.pull
// or StreamingPull is not called", and "Messages will accumulate for
// delivery continuously through the call regardless of changes to the
// PushConfig" (https://cloud.google.com/pubsub/docs/reference/rest/v1/projects.subscriptions/modifyPushConfig;
// the same field through UpdateSubscription's push_config mask). Nothing is
// delivered, so no delivery attempt is counted and nothing is dead-lettered
// while paused; messages wait in order. Resuming sets the push endpoint and
// OIDC identity back (PushTargets, from Terraform) and delivery starts again
// with the oldest waiting message. A message older than the subscription's
// retention when the consumer resumes is gone: pause for less.
//
// That is the broker's own pause, for ordered push consumers on Pub/Sub.
// Every other consumer (Eventarc: Eventarc owns its trigger's
// subscription, so relaybus does not change it behind it; pull workers;
// any consumer on NATS JetStream, which has no push) is paused by its own
// delivery control, a flag in its database (ControlConsumerFlag).

// PushTarget is how a push consumer's subscription delivers: the consume
// service's URL and the OIDC identity and audience of its pushes.
type PushTarget struct {
	Endpoint       string `json:"endpoint"`
	ServiceAccount string `json:"serviceAccount"`
	Audience       string `json:"audience"`
}

// ParsePushTargets reads DLQREPLAY_PUSH_TARGETS: a JSON object of logical
// subscription → PushTarget.
func ParsePushTargets(s string) (map[string]PushTarget, error) {
	out := map[string]PushTarget{}
	if s == "" {
		return out, nil
	}
	if err := json.Unmarshal([]byte(s), &out); err != nil {
		return nil, fmt.Errorf("DLQREPLAY_PUSH_TARGETS: want a JSON object of subscription to {endpoint, serviceAccount, audience}: %w", err)
	}
	for sub, t := range out {
		if t.Endpoint == "" || t.ServiceAccount == "" {
			return nil, fmt.Errorf("DLQREPLAY_PUSH_TARGETS[%s]: endpoint and serviceAccount are required", sub)
		}
	}
	return out, nil
}

// Pauser stops and restarts delivery to a consumer's subscription, named
// by its logical id (<topic>.<service>-<role>): on Google Cloud PushPauser
// (the push endpoint detached and set back), on the local stack its
// delivery loop. Pause and Resume report whether they changed anything.
type Pauser interface {
	Paused(ctx context.Context, subscription string) (bool, error)
	Pause(ctx context.Context, subscription string) (changed bool, err error)
	Resume(ctx context.Context, subscription string) (changed bool, err error)
}

// PushPauser pauses push subscriptions through the broker's
// PushConfigurer capability (Pub/Sub's subscription admin API: see the top
// of this file).
type PushPauser struct {
	Push broker.PushConfigurer
	// Subscriptions maps logical subscriptions to the real ones (nil: the
	// same).
	Subscriptions *topology.SubscriptionMap
	// Targets are what Resume sets back, by logical subscription.
	Targets map[string]PushTarget
}

func (p *PushPauser) real(sub string) string {
	if p.Subscriptions != nil {
		return p.Subscriptions.Real(sub)
	}
	return sub
}

// Paused reports whether the subscription has no push endpoint.
func (p *PushPauser) Paused(ctx context.Context, sub string) (bool, error) {
	cur, err := p.Push.PushEndpoint(ctx, p.real(sub))
	if err != nil {
		return false, brokerErr(err, "subscription "+sub)
	}
	return cur.URL == "", nil
}

// Pause detaches the push endpoint.
func (p *PushPauser) Pause(ctx context.Context, sub string) (bool, error) {
	return p.set(ctx, sub, broker.PushEndpoint{})
}

// Resume sets the push endpoint and OIDC identity of Targets back.
func (p *PushPauser) Resume(ctx context.Context, sub string) (bool, error) {
	t, ok := p.Targets[sub]
	if !ok {
		return false, fail(http.StatusConflict, "no_push_target", "dlqreplay does not know %s's push endpoint (DLQREPLAY_PUSH_TARGETS, set by Terraform)", sub)
	}
	return p.set(ctx, sub, broker.PushEndpoint{URL: t.Endpoint, ServiceAccount: t.ServiceAccount, Audience: t.Audience})
}

// set sets the push endpoint unless it is already as wanted.
func (p *PushPauser) set(ctx context.Context, sub string, e broker.PushEndpoint) (bool, error) {
	changed, err := p.Push.SetPushEndpoint(ctx, p.real(sub), e)
	if err != nil {
		return false, brokerErr(err, "subscription "+sub)
	}
	return changed, nil
}

// deliveryState is a consumer's delivery state.
type deliveryState struct {
	Topic              string `json:"topic"`
	Consumer           string `json:"consumer"`
	Subscription       string `json:"subscription"`
	PubSubSubscription string `json:"pubsubSubscription"`
	Delivery           string `json:"delivery"`
	// Control is how relaybus pauses this consumer: ControlPushEndpoint
	// or ControlConsumerFlag.
	Control string `json:"control"`
	// Paused: nothing is delivered; messages wait in the subscription
	// (or, with the consumer's flag, are kept in its database).
	Paused  bool `json:"paused"`
	Changed bool `json:"changed"`
	// PausedBy says who paused the consumer: operator, or breaker (a
	// forward consumer's target is down: consume's probe resumes it once
	// the target answers; an operator may resume it at once).
	PausedBy string `json:"pausedBy,omitempty"`
	// Held is how many deliveries the consumer kept while paused (the
	// consumer's flag only): published again when it resumes.
	Held int64 `json:"held"`
	// Republished is how many kept deliveries a resume published again.
	Republished int `json:"republished,omitempty"`
	// Done says what was done.
	Done string `json:"done,omitempty"`
}

// How a consumer is paused (deliveryState.Control).
const (
	// ControlPushEndpoint: the broker's own pause, an ordered push
	// subscription's endpoint detached (on the local stack, its delivery
	// loop stopped).
	ControlPushEndpoint = "push-endpoint"
	// ControlConsumerFlag: the consumer's own delivery control, a row in
	// its database that consume reads (inbox.PauseFlags): a pull worker
	// stops pulling and holds what it has without an attempt, an HTTP
	// delivery (Eventarc, or push where the broker has no pause) is kept
	// and acknowledged, and resuming publishes the kept ones again,
	// addressed to the consumer alone.
	ControlConsumerFlag = "consumer-flag"
)

// pulled reports whether a consumer is deployed in pull mode: declared so
// (DLQREPLAY_PULL_CONSUMERS), or on a broker that has no push (NATS
// JetStream: every consumer there is a consume worker pulling).
func (dl *deliveryControl) pulled(c topology.Consumer) bool {
	if dl.pull.has(c.Subscription()) {
		return true
	}
	if dl.broker == nil {
		return false
	}
	_, push := broker.As[broker.PushConfigurer](dl.broker)
	return !push
}

// kind is the consumer's delivery as the API reports it: pull, push or
// eventarc.
func (dl *deliveryControl) kind(c topology.Consumer) string {
	if dl.pulled(c) {
		return "pull"
	}
	return c.Delivery
}

// control is how c is paused: by its push endpoint when it is an ordered
// push consumer and a Pauser is configured (Pub/Sub, the local stack's
// delivery loop), else by its own flag.
func (dl *deliveryControl) control(c topology.Consumer) string {
	if dl.pauser != nil && !dl.pulled(c) && c.Delivery == topology.DeliveryPush {
		return ControlPushEndpoint
	}
	return ControlConsumerFlag
}

// controlledConsumer finds the consumer of a path.
func (dl *deliveryControl) controlledConsumer(r *request, args []string) (topology.Consumer, error) {
	topic, id, err := consumerArgs(r, args)
	if err != nil {
		return topology.Consumer{}, err
	}
	if err := decodeBody(r.Request, &struct{}{}, true); err != nil {
		return topology.Consumer{}, err
	}
	return dl.pausable(r.Context(), topic, id)
}

// pausable returns the consumer id on topic that the topology declares,
// or else the forwarder of that name added at run time (its subscription
// an ordered push one, paused like a declared push consumer's).
func (dl *deliveryControl) pausable(ctx context.Context, topic, id string) (topology.Consumer, error) {
	c, err := dl.declared(topic, id)
	if err == nil {
		return c, nil
	}
	if f, ok := dl.forwarders.consumer(ctx, topic, id); ok {
		return f, nil
	}
	return c, err
}

// forwarderTarget is where a forwarder's subscription pushes (set back by
// its resume); ok is false for a consumer the topology declares.
func (dl *deliveryControl) forwarderTarget(c topology.Consumer) (broker.PushEndpoint, bool) {
	if dl.forwarders == nil || c.Role != forwarders.Role {
		return broker.PushEndpoint{}, false
	}
	if dl.topology == nil {
		return broker.PushEndpoint{}, false
	}
	if _, declared := dl.topology.Consumer(c.Subscription()); declared {
		return broker.PushEndpoint{}, false
	}
	return dl.forwarders.pushEndpoint(c.Service), true
}

// resumePush sets c's push endpoint back: a forwarder's to the forwarders
// service (PushPauser knows the declared consumers' alone), any other's
// by the Pauser.
func (dl *deliveryControl) resumePush(ctx context.Context, c topology.Consumer) (bool, error) {
	if e, ok := dl.forwarderTarget(c); ok {
		if pp, ok := dl.pauser.(*PushPauser); ok {
			return pp.set(ctx, c.Subscription(), e)
		}
	}
	return dl.pauser.Resume(ctx, c.Subscription())
}

// flagPausedBy says who paused a consumer by its flag.
func flagPausedBy(ps inbox.PauseState) string {
	switch {
	case !ps.Paused:
		return ""
	case ps.ByBreaker:
		return inbox.PausedByBreaker
	}
	return inbox.PausedByOperator
}

func (dl *deliveryControl) stateOf(c topology.Consumer) deliveryState {
	return deliveryState{Topic: c.Topic, Consumer: c.Service, Subscription: c.Subscription(), PubSubSubscription: dl.subs.Real(c.Subscription()),
		Delivery: dl.kind(c), Control: dl.control(c)}
}

// setPaused pauses or resumes c by its control and says what it did.
func (dl *deliveryControl) setPaused(ctx context.Context, c topology.Consumer, paused bool, by string) (deliveryState, error) {
	st := dl.stateOf(c)
	st.Paused = paused
	if st.Control == ControlPushEndpoint {
		var err error
		if paused {
			// Recorded as the operator's first: a forward consumer's breaker
			// probe never lifts it, even over the breaker's own pause.
			dl.recordPushPause(ctx, c, by)
			st.Changed, err = dl.pauser.Pause(ctx, c.Subscription())
		} else {
			st.Changed, err = dl.resumePush(ctx, c)
			if err == nil {
				dl.clearPushPause(ctx, c)
			}
		}
		if err != nil {
			return st, err
		}
		st.PausedBy = inbox.PausedByOperator
		if !paused {
			st.PausedBy = ""
		}
		switch {
		case paused && st.Changed:
			st.Done = "the push endpoint of " + st.PubSubSubscription + " was detached: nothing is delivered, no delivery attempt is counted, messages wait in the subscription in order"
		case paused:
			st.Done = "already paused: nothing changed"
		case st.Changed:
			st.Done = "the push endpoint of " + st.PubSubSubscription + " was set back: delivery starts again with the oldest waiting message"
		default:
			st.Done = "not paused: nothing changed"
		}
		return st, nil
	}
	db, err := dl.database(c)
	if err != nil {
		return st, err
	}
	if st.Changed, err = inbox.SetPaused(ctx, db, c.Service, c.Topic, paused, by); err != nil {
		return st, pauseTableErr(err, c)
	}
	how := "consume holds every delivery it is handed from " + c.Topic + " in " + c.Database + " and acknowledges it (no delivery attempt is spent)"
	if st.Delivery == "pull" {
		how = "the pull worker of " + st.Subscription + " stops pulling; what it holds waits under its lease, answered with a hold (no delivery attempt is spent)"
	}
	switch {
	case paused && st.Changed:
		st.Done = fmt.Sprintf("paused by the consumer's own flag in database %s: within %s %s", c.Database, dl.pauseSettle, how)
	case paused:
		st.Done = "already paused: nothing changed"
	case st.Changed:
		st.Done = "the consumer's flag was lifted: delivery goes on"
	default:
		st.Done = "not paused by its flag: nothing changed"
	}
	if !paused {
		// Whether it was paused or not: what a pause kept is published
		// again (a resume that failed half-way is finished by another).
		n, err := inbox.PublishHeld(ctx, db, dl.publisher, c.Service, c.Topic, topology.TargetConsumerAttr)
		st.Republished = n
		if err != nil {
			return st, fmt.Errorf("resume of %s on %s: %d kept deliveries published again, the rest are still kept (resume again): %w", c.Service, c.Topic, n, err)
		}
		if n > 0 {
			st.Done += fmt.Sprintf("; %d deliveries kept while paused were published again to %s, addressed to %s alone", n, c.Topic, c.Service)
		}
	}
	ps, err := inbox.PausedState(ctx, db, c.Service, c.Topic)
	if err != nil {
		return st, pauseTableErr(err, c)
	}
	st.Held, st.PausedBy = ps.Held, flagPausedBy(ps)
	return st, nil
}

// pauseTableErr says that a consumer's database lacks the pause table
// (consume has not migrated it yet), or passes err on.
func pauseTableErr(err error, c topology.Consumer) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42P01" {
		return fail(http.StatusConflict, "not_migrated", "database %s has no relaybus_inbox_pause table: deploy %s's consume (its migrations create it) before pausing it", c.Database, c.Service)
	}
	return err
}

func (dl *deliveryControl) pause(r *request, args []string) (any, error) {
	return dl.pauseOrResume(r, args, true)
}

func (dl *deliveryControl) resume(r *request, args []string) (any, error) {
	return dl.pauseOrResume(r, args, false)
}

func (dl *deliveryControl) pauseOrResume(r *request, args []string, paused bool) (any, error) {
	c, err := dl.controlledConsumer(r, args)
	if err != nil {
		return nil, err
	}
	action, detail := audit.ConsumerPause, "pause delivery"
	if !paused {
		action, detail = audit.ConsumerResume, "resume delivery"
	}
	if err := dl.g.authorize(r, action, RoleOperator, target{Topic: c.Topic, Consumer: c.Service}); err != nil {
		return nil, err
	}
	if dl.control(c) == ControlConsumerFlag && !paused && dl.publisher == nil {
		return nil, fail(http.StatusNotImplemented, "unavailable", "resuming by the consumer's flag publishes what it kept: no publisher is configured")
	}
	var st deliveryState
	err = dl.g.run(r, audit.Entry{Action: action, Topic: c.Topic, ConsumerID: c.Service, Subscription: c.Subscription(),
		Detail: detail + " (" + dl.control(c) + ")"}, func(*step) (string, error) {
		var err error
		st, err = dl.setPaused(r.Context(), c, paused, r.who.Name)
		if err != nil {
			return "", err
		}
		return st.Done, nil
	})
	if err != nil {
		return nil, err
	}
	return st, nil
}

// deliveryState: GET /consumers/{topic}/{id}/delivery, whether a consumer
// is paused, and how.
func (dl *deliveryControl) deliveryState(r *request, args []string) (any, error) {
	topic, id, err := consumerArgs(r, args)
	if err != nil {
		return nil, err
	}
	c, err := dl.pausable(r.Context(), topic, id)
	if err != nil {
		return nil, err
	}
	st := dl.stateOf(c)
	if st.Control == ControlPushEndpoint {
		if st.Paused, err = dl.pauser.Paused(r.Context(), c.Subscription()); err != nil {
			return nil, err
		}
		if st.Paused {
			st.PausedBy = inbox.PausedByOperator
			if db, err := dl.database(c); err == nil && db != nil {
				if p, ok, err := inbox.PushPauseOf(r.Context(), db, c.Subscription()); err == nil && ok {
					st.PausedBy = p.By
				}
			}
		}
		return st, nil
	}
	db, err := dl.database(c)
	if err != nil {
		return nil, err
	}
	ps, err := inbox.PausedState(r.Context(), db, c.Service, c.Topic)
	if err != nil {
		return nil, pauseTableErr(err, c)
	}
	st.Paused, st.Held, st.PausedBy = ps.Paused, ps.Held, flagPausedBy(ps)
	return st, nil
}

// recordPushPause records an operator's pause of a push consumer in its
// database (inbox.PauseByOperator), so that its breaker's probe leaves the
// pause alone. Without the consumer's database here, or before its consume
// created the table, the pause goes on unrecorded (logged): only a pause
// the breaker recorded first could then be lifted by its probe.
func (dl *deliveryControl) recordPushPause(ctx context.Context, c topology.Consumer, by string) {
	db, err := dl.database(c)
	if err == nil && db == nil {
		return // no database at all (tests, a stack without one)
	}
	if err == nil {
		err = inbox.PauseByOperator(ctx, db, c.Subscription(), c.Service, by)
	}
	if err != nil {
		dl.logger.WarnContext(ctx, "dlqreplay: the operator's pause is not recorded in the consumer's database; a circuit breaker that paused it first may resume it",
			"subscription", c.Subscription(), "error", err.Error())
	}
}

// clearPushPause deletes the record of a push consumer's pause, whoever
// paused it, after an operator's resume.
func (dl *deliveryControl) clearPushPause(ctx context.Context, c topology.Consumer) {
	db, err := dl.database(c)
	if err == nil && db == nil {
		return
	}
	if err == nil {
		err = inbox.ClearPushPause(ctx, db, c.Subscription(), "")
	}
	if err != nil {
		dl.logger.WarnContext(ctx, "dlqreplay: the record of the consumer's pause could not be cleared", "subscription", c.Subscription(), "error", err.Error())
	}
}
