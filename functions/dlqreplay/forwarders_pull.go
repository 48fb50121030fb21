package dlqreplay

import (
	"time"

	"github.com/relaybus/relaybus/internal/forwarders"
	"github.com/relaybus/relaybus/shared/broker"
)

// pullSpec is f's subscription when the forwarders service pulls it
// (ForwardersOptions.Pull: NATS JetStream): a durable pull consumer of
// the topic that takes the messages stored from then on, with the
// topology's ack deadline. The rest of a declared consumer's settings are
// the pull worker's on that broker, as for a consumer the topology
// declares there (nats.Client.Provision): its backoff, its dead letter to
// <topic>.dlq after the topology's max_delivery_attempts, and the replay
// filter (the engine acknowledges, unapplied, a message addressed to
// another consumer). The forwarder's own filter goes to the broker, which
// refuses one it cannot apply (JetStream filters no attributes): the API
// then answers 400 naming the filter, and nothing is created.
func (fa *forwarderAPI) pullSpec(f forwarders.Forwarder) broker.SubscriptionSpec {
	c := f.Consumer(fa.topology)
	return broker.SubscriptionSpec{Name: f.Subscription(), Topic: f.Topic, Filter: f.Filter, Ordered: true,
		AckDeadline: time.Duration(c.AckDeadlineSeconds) * time.Second,
		MinBackoff:  time.Duration(c.MinBackoffSeconds) * time.Second, MaxBackoff: time.Duration(c.MaxBackoffSeconds) * time.Second,
		MaxDeliveryAttempts: c.MaxDeliveryAttempts, DeadLetterTopic: c.DeadLetterTopic()}
}
