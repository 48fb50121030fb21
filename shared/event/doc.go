// Package event is relaybus's event model: one Go type for one business fact,
// modeled as a CloudEvent, with its Pub/Sub encoding, a tolerant decoder and the
// validation rules every entry point shares.
//
// # The event as a CloudEvent
//
// An [Event] maps onto CloudEvents 1.0 like this:
//
//	Event field     CloudEvents attribute      Pub/Sub attribute (mirrored)
//	ID              id                         event_id
//	Type            type                       event_type
//	Source          source                     source_service
//	AggregateID     subject                    aggregate_id (and the ordering key)
//	OccurredAt      time                       occurred_at (RFC 3339, UTC)
//	PayloadType     datacontenttype            (content-type of the data, see below)
//	Payload         data / data_base64         -
//	Topic           topic                      -
//	AggregateType   aggregatetype              aggregate_type
//	Version         version                    version
//	SchemaVersion   schemaversion              schema_version
//	TraceID         traceid                    trace_id
//	SpanID          spanid                     span_id
//	ParentEventID   causationid                causation_id
//	CorrelationID   correlationid              correlation_id
//	SourceVersion   sourceversion              source_version
//	Initiator.*     initiatorservice,          user_id (= Initiator.UserID)
//	                initiatoroperation,
//	                initiatoruserid,
//	                initiatorrequestid
//	ExpireAt        expireat                   expire_at
//	DeliverAt       deliverat (read only)      -
//
// DeliverAt schedules the event in the outbox: the envelope's deliverAt
// and the extension deliverat are read on the way in, and the published
// message does not carry it.
// Extension names are the Pub/Sub attribute names without underscores, so a
// reader who knows one knows the other. They are part of relaybus's public
// contract and do not change. [Event.CloudEventAttributes] returns the
// table's CloudEvents side as strings.
//
// # On Pub/Sub
//
// The wire codec lives in internal/cloudevent: it writes the event in
// CloudEvents structured mode into the message data, JSON
// (application/cloudevents+json) by default, protobuf
// (application/cloudevents+protobuf) for topics that ask for it, with the
// attributes above mirrored ([Attributes]) and the aggregate id as the
// ordering key; its decoder accepts structured mode (JSON or protobuf),
// binary mode (ce-* attributes) and legacy messages that carry only the
// attributes. This package declares what the codec reads and writes
// ([Message], [Encoding], [Decoded], [DecodeError]) and has no third-party
// imports: a program that builds events (a producer enqueueing through
// shared/outbox, the Go client) links neither the CloudEvents SDK nor
// protobuf.
//
// # Errors
//
// Every validation failure is a [*FieldError] that names the field (in the
// envelope's JSON spelling) and the rule it broke. Several failures are joined
// with [errors.Join]; use [errors.As] to reach them and [errors.Is] with
// [ErrInvalid] or [ErrTooLarge] to classify.
package event
