package pubsub

import (
	"context"
	"errors"
	"fmt"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/relaybus/relaybus/internal/names"
	"github.com/relaybus/relaybus/shared/broker"
	"github.com/relaybus/relaybus/shared/event"
)

// PullWait is how long one Pull waits for messages before it returns none.
const PullWait = 5 * time.Second

// Pull pulls at most max messages of subscription with one unary Pull
// (https://cloud.google.com/pubsub/docs/pull#unary_pull), each leased for
// the subscription's ack deadline; Extend renews it with
// ModifyAckDeadline and Nack sets it to the delay
// (https://cloud.google.com/pubsub/docs/lease-management). With ordering
// on, Pub/Sub hands out a key's messages in order.
func (c *Client) Pull(ctx context.Context, subscription string, max int) ([]broker.Lease, error) {
	sub, err := c.subscription(ctx, subscription)
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, PullWait)
	defer cancel()
	res, err := c.ps.SubscriptionAdminClient.Pull(pctx, &pb.PullRequest{Subscription: sub.name, MaxMessages: int32(max)})
	if err != nil {
		if ctx.Err() == nil && (errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded) {
			return nil, nil
		}
		return nil, fmt.Errorf("pull %s: %w", subscription, err)
	}
	out := make([]broker.Lease, 0, len(res.ReceivedMessages))
	for _, rm := range res.ReceivedMessages {
		pm := rm.Message
		m := event.Message{ID: pm.MessageId, Data: pm.Data, Attributes: pm.Attributes, OrderingKey: pm.OrderingKey,
			PublishTime: pm.PublishTime.AsTime(), DeliveryAttempt: int(rm.DeliveryAttempt), Topic: sub.topic}
		out = append(out, &pubsubLease{c: c, sub: sub, ackID: rm.AckId, m: m})
	}
	return out, nil
}

type subscriptionInfo struct {
	name     string
	topic    string
	deadline int32
}

// subscription looks a subscription's topic and ack deadline up once.
func (c *Client) subscription(ctx context.Context, id string) (subscriptionInfo, error) {
	id = names.ResourceID(id)
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.subs[id]; ok {
		return s, nil
	}
	name := "projects/" + c.ps.Project() + "/subscriptions/" + id
	s, err := c.ps.SubscriptionAdminClient.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: name})
	if err != nil {
		return subscriptionInfo{}, fmt.Errorf("subscription %s: %w", id, err)
	}
	info := subscriptionInfo{name: name, topic: names.ResourceID(s.Topic), deadline: s.AckDeadlineSeconds}
	if info.deadline <= 0 {
		info.deadline = 10
	}
	if c.subs == nil {
		c.subs = map[string]subscriptionInfo{}
	}
	c.subs[id] = info
	return info, nil
}

type pubsubLease struct {
	c     *Client
	sub   subscriptionInfo
	ackID string
	m     event.Message
}

func (l *pubsubLease) Message() event.Message { return l.m }

func (l *pubsubLease) Ack(ctx context.Context) error {
	return l.c.ps.SubscriptionAdminClient.Acknowledge(ctx, &pb.AcknowledgeRequest{Subscription: l.sub.name, AckIds: []string{l.ackID}})
}

func (l *pubsubLease) Nack(ctx context.Context, delay time.Duration) error {
	return l.modify(ctx, int32((delay+time.Second-1)/time.Second))
}

func (l *pubsubLease) Extend(ctx context.Context) error { return l.modify(ctx, l.sub.deadline) }

func (l *pubsubLease) modify(ctx context.Context, secs int32) error {
	return l.c.ps.SubscriptionAdminClient.ModifyAckDeadline(ctx, &pb.ModifyAckDeadlineRequest{
		Subscription: l.sub.name, AckIds: []string{l.ackID}, AckDeadlineSeconds: secs})
}
