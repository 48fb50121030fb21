// Package cloudevent is relaybus's wire codec: an [event.Event] as a
// CloudEvent on Pub/Sub (and on NATS JetStream, which carries the same
// message), through the CloudEvents SDK (github.com/cloudevents/sdk-go).
//
// [Encode] writes the event in CloudEvents structured mode into the
// message data: JSON (application/cloudevents+json) by default, protobuf
// (application/cloudevents+protobuf) for topics that ask for it, or binary
// mode (the data is the payload, the context attributes travel as ce-*
// attributes) for a topic with a Pub/Sub schema. The message's
// content-type attribute names the format, as the CloudEvents Pub/Sub
// binding says, and relaybus's attributes are mirrored ([event.Attributes])
// so that subscription filters, dashboards and legacy readers need not
// parse the data. The ordering key is the aggregate id.
//
// [Decode] accepts three shapes: structured mode (JSON or protobuf), binary
// mode (ce-* attributes, the data is the payload) and legacy messages that
// carry only the attributes with the raw payload as data. The aggregate id
// is taken from the envelope first, then the aggregate_id attribute, then
// the ordering key ([event.ExtractAggregateID]).
//
// The codec lives apart from shared/event so that the event model stays a
// leaf with no third-party imports: a program that only builds events (a
// producer enqueueing through shared/outbox, the Go client) links neither
// the CloudEvents SDK nor protobuf.
package cloudevent
