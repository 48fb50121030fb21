package dlqreplay

import (
	"encoding/json"
	"fmt"
	"net/http"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/relaybus/relaybus/shared/ledger"
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

// deliveryState is a consumer's delivery as Pub/Sub has it.
type deliveryState struct {
	Topic              string `json:"topic"`
	Consumer           string `json:"consumer"`
	Subscription       string `json:"subscription"`
	PubSubSubscription string `json:"pubsubSubscription"`
	Delivery           string `json:"delivery"`
	// Paused: the push subscription has no push endpoint (messages wait).
	Paused       bool   `json:"paused"`
	PushEndpoint string `json:"pushEndpoint,omitempty"`
	Changed      bool   `json:"changed"`
}

// pushConsumer finds the push consumer of a path and its subscription.
func (a *api) pushConsumer(r *request, args []string, verb string) (topology.Consumer, string, error) {
	topic, id, err := consumerArgs(r, args)
	if err != nil {
		return topology.Consumer{}, "", err
	}
	if err := decodeBody(r.Request, &struct{}{}, true); err != nil {
		return topology.Consumer{}, "", err
	}
	c, err := a.declared(topic, id)
	if err != nil {
		return c, "", err
	}
	if c.Delivery != topology.DeliveryPush {
		return c, "", fail(http.StatusConflict, "eventarc", "%s on %s is delivered by an Eventarc trigger, which owns its subscription's push configuration: relaybus cannot %s it (declare the consumer with delivery: push to pause it)", id, topic, verb)
	}
	if a.o.Seeker == nil {
		return c, "", fail(http.StatusNotImplemented, "unavailable", "Pub/Sub administration is not configured")
	}
	return c, "projects/" + a.o.Seeker.Project + "/subscriptions/" + a.o.Subscriptions.Real(c.Subscription()), nil
}

func (a *api) pauseConsumer(r *request, args []string) (any, error) {
	c, sub, err := a.pushConsumer(r, args, "pause")
	if err != nil {
		return nil, err
	}
	st, err := a.setPush(r, c, sub, nil)
	if err != nil {
		return nil, err
	}
	if st.Changed {
		a.record(r, ledger.AuditEntry{Action: "consumer.pause", Topic: c.Topic, ConsumerID: c.Service, Subscription: c.Subscription(),
			Detail: "push endpoint detached: messages wait in " + c.Subscription()},
			"dlqreplay: consumer paused", "topic", c.Topic, "consumer", c.Service, "subscription", c.Subscription())
	}
	return st, nil
}

func (a *api) resumeConsumer(r *request, args []string) (any, error) {
	c, sub, err := a.pushConsumer(r, args, "resume")
	if err != nil {
		return nil, err
	}
	t, ok := a.o.PushTargets[c.Subscription()]
	if !ok {
		return nil, fail(http.StatusConflict, "no_push_target", "dlqreplay does not know %s's push endpoint (DLQREPLAY_PUSH_TARGETS, set by Terraform)", c.Subscription())
	}
	st, err := a.setPush(r, c, sub, &t)
	if err != nil {
		return nil, err
	}
	if st.Changed {
		a.record(r, ledger.AuditEntry{Action: "consumer.resume", Topic: c.Topic, ConsumerID: c.Service, Subscription: c.Subscription(),
			Detail: "push endpoint " + t.Endpoint + " restored"},
			"dlqreplay: consumer resumed", "topic", c.Topic, "consumer", c.Service, "subscription", c.Subscription())
	}
	return st, nil
}

// setPush reads the subscription and, when its push endpoint is not
// already as wanted (t nil: none), updates it.
func (a *api) setPush(r *request, c topology.Consumer, sub string, t *PushTarget) (deliveryState, error) {
	st := deliveryState{Topic: c.Topic, Consumer: c.Service, Subscription: c.Subscription(), PubSubSubscription: a.o.Subscriptions.Real(c.Subscription()), Delivery: c.Delivery}
	cur, err := a.o.Seeker.Admin.GetSubscription(r.Context(), &pb.GetSubscriptionRequest{Subscription: sub})
	if err != nil {
		return st, pubsubErr(err, "subscription "+c.Subscription())
	}
	endpoint := cur.GetPushConfig().GetPushEndpoint()
	want := &pb.PushConfig{}
	if t != nil {
		want = &pb.PushConfig{PushEndpoint: t.Endpoint, AuthenticationMethod: &pb.PushConfig_OidcToken_{
			OidcToken: &pb.PushConfig_OidcToken{ServiceAccountEmail: t.ServiceAccount, Audience: t.Audience}}}
	}
	if endpoint != want.GetPushEndpoint() || (t != nil && cur.GetPushConfig().GetOidcToken().GetServiceAccountEmail() != t.ServiceAccount) {
		cur, err = a.o.Seeker.Admin.UpdateSubscription(r.Context(), &pb.UpdateSubscriptionRequest{
			Subscription: &pb.Subscription{Name: sub, PushConfig: want},
			UpdateMask:   &fieldmaskpb.FieldMask{Paths: []string{"push_config"}},
		})
		if err != nil {
			return st, pubsubErr(err, "subscription "+c.Subscription())
		}
		st.Changed = true
	}
	st.PushEndpoint = cur.GetPushConfig().GetPushEndpoint()
	st.Paused = st.PushEndpoint == ""
	return st, nil
}

// consumerDelivery: GET /consumers/{topic}/{id}/delivery, whether a push
// consumer is paused.
func (a *api) consumerDelivery(r *request, args []string) (any, error) {
	topic, id, err := consumerArgs(r, args)
	if err != nil {
		return nil, err
	}
	c, err := a.declared(topic, id)
	if err != nil {
		return nil, err
	}
	st := deliveryState{Topic: c.Topic, Consumer: c.Service, Subscription: c.Subscription(), PubSubSubscription: a.o.Subscriptions.Real(c.Subscription()), Delivery: c.Delivery}
	if c.Delivery != topology.DeliveryPush || a.o.Seeker == nil {
		return st, nil
	}
	cur, err := a.o.Seeker.Admin.GetSubscription(r.Context(), &pb.GetSubscriptionRequest{Subscription: "projects/" + a.o.Seeker.Project + "/subscriptions/" + st.PubSubSubscription})
	if err != nil {
		return nil, pubsubErr(err, "subscription "+c.Subscription())
	}
	st.PushEndpoint = cur.GetPushConfig().GetPushEndpoint()
	st.Paused = st.PushEndpoint == ""
	return st, nil
}
