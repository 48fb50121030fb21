package devstack

import (
	"context"

	"github.com/relaybus/relaybus/shared/broker"
	"github.com/relaybus/relaybus/shared/broker/pubsub"
	"github.com/relaybus/relaybus/shared/topology"
)

// Forwarders creates and deletes the subscriptions of the forward
// consumers added at run time (the operations API's /forwarders) as
// pull subscriptions, and points the delivery loop at each, as Pub/Sub's
// push would deliver them to the forwarders service (a
// broker.SubscriptionAdmin).
type Forwarders struct {
	Client *pubsub.Client
	Loop   *Loop
}

var _ broker.SubscriptionAdmin = (*Forwarders)(nil)

// CreateSubscription creates s without its push endpoint (neither fake
// pushes; the gcloud emulator would, besides the loop) and delivers it
// there with the loop, dead-lettering after s.MaxDeliveryAttempts.
func (f *Forwarders) CreateSubscription(ctx context.Context, s broker.SubscriptionSpec) error {
	push := s.Push
	s.Push = broker.PushEndpoint{}
	if err := f.Client.CreateSubscription(ctx, s); err != nil {
		return err
	}
	f.Loop.Add(Route{Subscription: s.Name, Topic: s.Topic, URL: push.URL, Mode: topology.DeliveryPush, MaxAttempts: s.MaxDeliveryAttempts})
	return nil
}

// DeleteSubscription stops the loop's delivery of subscription, then
// deletes it.
func (f *Forwarders) DeleteSubscription(ctx context.Context, subscription string) error {
	f.Loop.Remove(subscription)
	return f.Client.DeleteSubscription(ctx, subscription)
}
