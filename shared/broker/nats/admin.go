package nats

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/relaybus/relaybus/internal/names"
	"github.com/relaybus/relaybus/shared/broker"
)

// CreateSubscription is broker.SubscriptionAdmin's: it creates the
// durable pull consumer standing for s.Name on s.Topic's stream, which
// delivers the messages stored from then on (DeliverNew: what the stream
// held before is not delivered, as a new Pub/Sub subscription receives
// only what is published after it exists), with explicit acks and
// s.AckDeadline as AckWait (DefaultAckWait when 0).
//
// The rest of s is the pull worker's on JetStream, as for a consumer
// Provision creates: the backoff between redeliveries (MinBackoff,
// MaxBackoff) and the dead letter after MaxDeliveryAttempts to
// DeadLetterTopic; Ordered holds anyway (a consumer delivers in stream
// order); Retention is the stream's. Two settings JetStream cannot honor
// are refused (ErrRefused), not ignored: a Filter (JetStream filters by
// subject, not by attributes) and a Push endpoint (relaybus's consumers
// pull JetStream). ErrExists when a durable consumer of that name exists;
// ErrRefused when the topic has no stream (the topology is not
// provisioned).
func (c *Client) CreateSubscription(ctx context.Context, s broker.SubscriptionSpec) error {
	sub, topic := names.ResourceID(s.Name), names.ResourceID(s.Topic)
	switch {
	case s.Filter != "":
		return &broker.Error{Kind: broker.ErrRefused, Reason: "NATS JetStream cannot filter a subscription on message attributes (its consumers filter by subject only): leave the filter empty", Err: errors.ErrUnsupported}
	case s.Push != (broker.PushEndpoint{}):
		return &broker.Error{Kind: broker.ErrRefused, Reason: "NATS JetStream has no push subscriptions: the consumer pulls its durable consumer (CONSUMER_MODE=pull)", Err: errors.ErrUnsupported}
	}
	stream := StreamName(topic)
	if _, err := c.js.Consumer(ctx, stream, ConsumerName(sub)); err == nil {
		return &broker.Error{Kind: broker.ErrExists, Reason: "subscription " + sub + " exists (a durable consumer of that name on stream " + stream + ")", Err: jetstream.ErrConsumerExists}
	} else if errors.Is(err, jetstream.ErrStreamNotFound) {
		return &broker.Error{Kind: broker.ErrRefused, Reason: "topic " + topic + " has no stream on the NATS server: provision the topology first", Err: err}
	} else if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("nats: subscription %s: %w", sub, err)
	}
	ack := s.AckDeadline
	if ack <= 0 {
		ack = DefaultAckWait
	}
	cons, err := c.js.CreateConsumer(ctx, stream, jetstream.ConsumerConfig{
		Durable: ConsumerName(sub), AckPolicy: jetstream.AckExplicitPolicy, AckWait: ack,
		DeliverPolicy: jetstream.DeliverNewPolicy, MaxDeliver: -1, MaxAckPending: DefaultMaxAckPending,
	})
	if errors.Is(err, jetstream.ErrConsumerExists) {
		return &broker.Error{Kind: broker.ErrExists, Reason: "subscription " + sub + " exists (a durable consumer of that name on stream " + stream + ")", Err: err}
	}
	if err != nil {
		return fmt.Errorf("nats: create subscription %s: %w", sub, err)
	}
	c.mu.Lock()
	c.consumers[sub] = consumerInfo{c: cons, topic: topic}
	c.mu.Unlock()
	return nil
}

// DeleteSubscription is broker.SubscriptionAdmin's: it deletes the
// durable consumer standing for subscription (its topic read from its
// name, <topic>.<consumer>-<role>) and with it what it had not delivered;
// a pull of it from then on fails. ErrNotFound when there is none.
func (c *Client) DeleteSubscription(ctx context.Context, subscription string) error {
	sub := names.ResourceID(subscription)
	topic := ""
	c.mu.Lock()
	if ci, ok := c.consumers[sub]; ok {
		topic = ci.topic
	}
	delete(c.consumers, sub)
	c.mu.Unlock()
	if topic == "" {
		t, _, _, err := names.ParseSubscription(sub)
		if err != nil {
			return &broker.Error{Kind: broker.ErrNotFound, Reason: "subscription " + sub + " is not named <topic>.<consumer>-<role>: no durable consumer stands for it", Err: err}
		}
		topic = t
	}
	err := c.js.DeleteConsumer(ctx, StreamName(topic), ConsumerName(sub))
	if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
		return &broker.Error{Kind: broker.ErrNotFound, Reason: "subscription " + sub + " does not exist (no durable consumer of that name)", Err: err}
	}
	if err != nil {
		return fmt.Errorf("nats: delete subscription %s: %w", sub, err)
	}
	return nil
}
