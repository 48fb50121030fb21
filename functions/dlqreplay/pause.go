package dlqreplay

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

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
// Eventarc consumers are refused: Eventarc created and manages its
// trigger's subscription, so relaybus does not change that subscription's
// delivery behind it. A consumer that must be paused is declared with
// delivery: push.

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
	// Paused: nothing is delivered; messages wait in the subscription.
	Paused  bool `json:"paused"`
	Changed bool `json:"changed"`
}

// pulled reports whether a consumer is deployed in pull mode.
func (dl *deliveryControl) pulled(c topology.Consumer) bool { return dl.pull.has(c.Subscription()) }

// pushConsumer finds the push consumer of a path.
func (dl *deliveryControl) pushConsumer(r *request, args []string, verb string) (topology.Consumer, error) {
	topic, id, err := consumerArgs(r, args)
	if err != nil {
		return topology.Consumer{}, err
	}
	if err := decodeBody(r.Request, &struct{}{}, true); err != nil {
		return topology.Consumer{}, err
	}
	c, err := dl.declared(topic, id)
	if err != nil {
		return c, err
	}
	if dl.pulled(c) {
		return c, fail(http.StatusConflict, "pull", "%s on %s is deployed in pull mode (pull_mode): a worker in its consume service pulls the subscription, so there is no push endpoint to %s. It stops when its consume service does; to rewind it, seek its subscription (relaybus seek)", id, topic, verb)
	}
	if c.Delivery != topology.DeliveryPush {
		return c, fail(http.StatusConflict, "eventarc", "%s on %s is delivered by an Eventarc trigger, which owns its subscription's push configuration: relaybus cannot %s it (declare the consumer with delivery: push to pause it)", id, topic, verb)
	}
	if dl.pauser == nil {
		return c, fail(http.StatusNotImplemented, "unavailable", "pausing is not configured (no Pub/Sub administration)")
	}
	return c, nil
}

func (dl *deliveryControl) stateOf(c topology.Consumer) deliveryState {
	return deliveryState{Topic: c.Topic, Consumer: c.Service, Subscription: c.Subscription(), PubSubSubscription: dl.subs.Real(c.Subscription()), Delivery: c.Delivery}
}

func (dl *deliveryControl) pause(r *request, args []string) (any, error) {
	c, err := dl.pushConsumer(r, args, "pause")
	if err != nil {
		return nil, err
	}
	if err := dl.g.authorize(r, audit.ConsumerPause, RoleOperator, target{Topic: c.Topic, Consumer: c.Service}); err != nil {
		return nil, err
	}
	st := dl.stateOf(c)
	err = dl.g.run(r, audit.Entry{Action: audit.ConsumerPause, Topic: c.Topic, ConsumerID: c.Service, Subscription: c.Subscription(),
		Detail: "pause delivery"}, func(*step) (string, error) {
		var err error
		if st.Changed, err = dl.pauser.Pause(r.Context(), c.Subscription()); err != nil {
			return "", err
		}
		if !st.Changed {
			return "already paused: nothing changed", nil
		}
		return "delivery paused: messages wait in " + c.Subscription(), nil
	})
	if err != nil {
		return nil, err
	}
	st.Paused = true
	return st, nil
}

func (dl *deliveryControl) resume(r *request, args []string) (any, error) {
	c, err := dl.pushConsumer(r, args, "resume")
	if err != nil {
		return nil, err
	}
	if err := dl.g.authorize(r, audit.ConsumerResume, RoleOperator, target{Topic: c.Topic, Consumer: c.Service}); err != nil {
		return nil, err
	}
	st := dl.stateOf(c)
	err = dl.g.run(r, audit.Entry{Action: audit.ConsumerResume, Topic: c.Topic, ConsumerID: c.Service, Subscription: c.Subscription(),
		Detail: "resume delivery"}, func(*step) (string, error) {
		var err error
		if st.Changed, err = dl.pauser.Resume(r.Context(), c.Subscription()); err != nil {
			return "", err
		}
		if !st.Changed {
			return "not paused: nothing changed", nil
		}
		return "delivery resumed", nil
	})
	if err != nil {
		return nil, err
	}
	return st, nil
}

// deliveryState: GET /consumers/{topic}/{id}/delivery, whether a push
// consumer is paused.
func (dl *deliveryControl) deliveryState(r *request, args []string) (any, error) {
	topic, id, err := consumerArgs(r, args)
	if err != nil {
		return nil, err
	}
	c, err := dl.declared(topic, id)
	if err != nil {
		return nil, err
	}
	st := dl.stateOf(c)
	if dl.pulled(c) {
		st.Delivery = "pull"
	}
	if c.Delivery != topology.DeliveryPush || dl.pulled(c) || dl.pauser == nil {
		return st, nil
	}
	if st.Paused, err = dl.pauser.Paused(r.Context(), c.Subscription()); err != nil {
		return nil, err
	}
	return st, nil
}
