package pubsub

import (
	"context"
	"fmt"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/relaybus/relaybus/internal/names"
	"github.com/relaybus/relaybus/shared/broker"
	"github.com/relaybus/relaybus/shared/topology"
)

// ProvisionOptions configure Client.Provision (Options.Provision).
type ProvisionOptions struct {
	// DeadLetterPolicy sets Pub/Sub's dead-letter policy on consumer
	// subscriptions. Leave it off for pstest, whose dead-lettering is broken;
	// the local delivery loop dead-letters itself.
	DeadLetterPolicy bool
}

// Provision is the broker contract's provisioning (broker.Provisioner),
// with the client's Options.Provision. It creates, in the client's
// project, what Terraform creates in production for a topology: every topic with its retention, its <topic>.dlq
// with a <topic>.dlq-monitor subscription, one ordered subscription per
// consumer (ack deadline, retry policy, replay filter, retained acked
// messages for seeks, and optionally the dead-letter policy), and the rollup
// topic with its subscription. It is idempotent: what exists is left alone.
//
// Subscriptions here are pull subscriptions; in the local stack a delivery
// loop pulls them and posts to the functions the way push and Eventarc would.
func (c *Client) Provision(ctx context.Context, t *topology.Topology) error {
	opts := c.provision
	project := c.Project()
	topicPath := func(id string) string { return "projects/" + project + "/topics/" + id }
	subPath := func(id string) string { return "projects/" + project + "/subscriptions/" + id }
	secs := func(s int) *durationpb.Duration { return durationpb.New(time.Duration(s) * time.Second) }
	admin := c.ps.TopicAdminClient
	subs := c.ps.SubscriptionAdminClient

	mkTopic := func(id string, retention int) error {
		tp := &pb.Topic{Name: topicPath(id)}
		if retention > 0 {
			tp.MessageRetentionDuration = secs(retention)
		}
		_, err := admin.CreateTopic(ctx, tp)
		if status.Code(err) == codes.AlreadyExists {
			return nil
		}
		if err != nil {
			return fmt.Errorf("create topic %s: %w", id, err)
		}
		return nil
	}
	mkSub := func(s *pb.Subscription) error {
		_, err := subs.CreateSubscription(ctx, s)
		if status.Code(err) == codes.AlreadyExists {
			return nil
		}
		if err != nil {
			return fmt.Errorf("create subscription %s: %w", names.ResourceID(s.Name), err)
		}
		return nil
	}

	if err := mkTopic(t.Rollup.Topic, 0); err != nil {
		return err
	}
	if err := mkSub(&pb.Subscription{
		Name: subPath(broker.RollupSubscription(t)), Topic: topicPath(t.Rollup.Topic),
		AckDeadlineSeconds: int32(t.Defaults.AckDeadlineSeconds),
		RetryPolicy:        &pb.RetryPolicy{MinimumBackoff: secs(1), MaximumBackoff: secs(60)},
	}); err != nil {
		return err
	}
	for _, tp := range t.Topics {
		if err := mkTopic(tp.Name, tp.MessageRetentionSeconds); err != nil {
			return err
		}
		dlq := names.DeadLetter(tp.Name)
		if err := mkTopic(dlq, tp.MessageRetentionSeconds); err != nil {
			return err
		}
		if err := mkSub(&pb.Subscription{
			Name: subPath(names.DeadLetterMonitor(tp.Name)), Topic: topicPath(dlq),
			AckDeadlineSeconds: int32(t.Defaults.AckDeadlineSeconds),
		}); err != nil {
			return err
		}
		for _, cs := range tp.Consumers {
			s := &pb.Subscription{
				Name:                     subPath(cs.Subscription()),
				Topic:                    topicPath(tp.Name),
				AckDeadlineSeconds:       int32(cs.AckDeadlineSeconds),
				EnableMessageOrdering:    true,
				Filter:                   cs.Filter(),
				RetainAckedMessages:      true,
				MessageRetentionDuration: secs(tp.MessageRetentionSeconds),
				RetryPolicy:              &pb.RetryPolicy{MinimumBackoff: secs(cs.MinBackoffSeconds), MaximumBackoff: secs(cs.MaxBackoffSeconds)},
			}
			if opts.DeadLetterPolicy {
				s.DeadLetterPolicy = &pb.DeadLetterPolicy{DeadLetterTopic: topicPath(dlq), MaxDeliveryAttempts: int32(cs.MaxDeliveryAttempts)}
			}
			if err := mkSub(s); err != nil {
				return err
			}
		}
	}
	return nil
}
