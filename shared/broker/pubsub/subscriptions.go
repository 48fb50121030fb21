package pubsub

import (
	"context"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/relaybus/relaybus/shared/broker"
)

var _ broker.SubscriptionAdmin = (*Client)(nil)

// CreateSubscription creates s (broker.SubscriptionAdmin): a push
// subscription with OIDC authentication when s.Push is set, else a pull
// one; retained acknowledged messages when s.Retention is set, so an
// operator can seek it back. It never expires: without an expiration
// policy Pub/Sub deletes a subscription after 31 days without activity
// (a quiet topic's forwarder would vanish), so it sets one without a TTL,
// as Terraform does for the topology's subscriptions.
func (c *Client) CreateSubscription(ctx context.Context, s broker.SubscriptionSpec) error {
	topicPath := "projects/" + c.ps.Project() + "/topics/"
	dur := func(d time.Duration) *durationpb.Duration {
		if d <= 0 {
			return nil
		}
		return durationpb.New(d)
	}
	sub := &pb.Subscription{
		Name:                  c.subPath(s.Name),
		Topic:                 topicPath + s.Topic,
		Filter:                s.Filter,
		EnableMessageOrdering: s.Ordered,
		AckDeadlineSeconds:    int32(s.AckDeadline / time.Second),
		// "If expiration_policy is set, but expiration_policy.ttl is not
		// set, the subscription never expires" (pubsubpb.Subscription).
		ExpirationPolicy: &pb.ExpirationPolicy{},
	}
	if s.MinBackoff > 0 || s.MaxBackoff > 0 {
		sub.RetryPolicy = &pb.RetryPolicy{MinimumBackoff: dur(s.MinBackoff), MaximumBackoff: dur(s.MaxBackoff)}
	}
	if s.DeadLetterTopic != "" {
		sub.DeadLetterPolicy = &pb.DeadLetterPolicy{DeadLetterTopic: topicPath + s.DeadLetterTopic, MaxDeliveryAttempts: int32(s.MaxDeliveryAttempts)}
	}
	if s.Retention > 0 {
		sub.RetainAckedMessages, sub.MessageRetentionDuration = true, dur(s.Retention)
	}
	if s.Push.URL != "" {
		sub.PushConfig = &pb.PushConfig{PushEndpoint: s.Push.URL}
		if s.Push.ServiceAccount != "" {
			sub.PushConfig.AuthenticationMethod = &pb.PushConfig_OidcToken_{
				OidcToken: &pb.PushConfig_OidcToken{ServiceAccountEmail: s.Push.ServiceAccount, Audience: s.Push.Audience}}
		}
	}
	_, err := c.ps.SubscriptionAdminClient.CreateSubscription(ctx, sub)
	return adminErr(err, "subscription "+s.Name)
}

// DeleteSubscription deletes subscription (broker.SubscriptionAdmin): its
// backlog goes with it.
func (c *Client) DeleteSubscription(ctx context.Context, subscription string) error {
	err := c.ps.SubscriptionAdminClient.DeleteSubscription(ctx, &pb.DeleteSubscriptionRequest{Subscription: c.subPath(subscription)})
	return adminErr(err, "subscription "+subscription)
}
