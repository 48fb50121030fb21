// Package publish is relaybus's publish function: the HTTP front door for
// callers that are not Go services enqueueing in their own transaction.
//
// # Requests
//
// One POST carries one event or a batch, in any of these forms:
//
//	CloudEvents binary mode      ce-specversion, ce-id, ce-type, ce-source, ce-subject, ce-topic,
//	                             ce-version... headers; the body is the payload and Content-Type
//	                             its type (what the sdk-go client sends by default)
//	CloudEvents structured mode  Content-Type: application/cloudevents+json (or +protobuf)
//	CloudEvents batch mode       Content-Type: application/cloudevents-batch+json, a JSON array
//	plain envelope               Content-Type: application/json, one JSON object with relaybus's
//	                             field names (eventId, eventType, topic, aggregateId, version, ...)
//	plain envelope batch         Content-Type: application/json, a JSON array of envelopes
//
// The CloudEvents forms are read with the CloudEvents SDK's HTTP binding, so
// the modes are told apart exactly as the SDK's own receivers do. The
// extension attributes are shared/event's (topic, aggregatetype, version,
// schemaversion, traceid, spanid, causationid, correlationid, initiator*,
// expireat), and deliverat (RFC 3339) schedules the event (the envelope's
// deliverAt; docs/producing.md, "Scheduled events"); subject is the
// aggregate id.
//
// What a caller may leave out is filled by event.Prepare: the event id (a
// UUID; callers that may retry should send their own, since idempotency is
// on the id), occurredAt (now), the aggregate type (the topic's middle
// segment), the source (the initiator's service) and the trace id. The
// trace id and span id come, in this order, from the event itself, a
// CloudEvents traceparent extension (distributed tracing), a W3C
// traceparent request header, or a new random trace id.
//
// # Answers
//
//	202 Accepted   the event is in the outbox: {"eventId", "status", "duplicate", "topic",
//	               "aggregateId", "version", "traceId"}; status is published (the fast path put it
//	               on Pub/Sub before answering) or pending (the relay will); a repeated event
//	               (same eventId, topic, aggregate, version, type and payload) answers the
//	               recorded event's state with duplicate: true and writes nothing
//	200 OK         every event was SKIPPED: its topic has no enabled consumer in the topic
//	               registry; nothing is written, an ERROR is logged, "reason" says why
//	400            invalid_event (every field of every event that breaks a rule, with the rule)
//	               or malformed (not JSON, not a CloudEvent)
//	401            unauthenticated (PUBLISH_AUTH=cloudrun): no ID token, or one that is expired,
//	               not Google's, or for another audience (PUBLISH_AUDIENCE)
//	403            forbidden (PUBLISH_AUTH=cloudrun): the caller is not one of the topic's
//	               publishers; a topic that declares none takes nobody
//	405            not POST (Allow: POST)
//	409            version_conflict: the aggregate already has that version under another id;
//	               event_id_conflict: another event already has that eventId (a retry must repeat
//	               the same event, a new event needs a new id). Neither says anything of the
//	               stored event.
//	413            too_large: body over the body limit, payload over PUBLISH_MAX_PAYLOAD_BYTES,
//	               or more events than the batch limit
//	415            unsupported_media_type
//	429            rate_limited: the caller sent more than PUBLISH_RATE_LIMIT requests per
//	               second (per instance; Retry-After says when to retry), nothing written
//	503            unavailable: the outbox or the registry cannot be reached, or the outbox
//	               did not answer within PUBLISH_BUDGET (the event may have been written);
//	               busy: every request slot is taken, nothing written (Retry-After: 1);
//	               retrying with the same eventId is always safe
//
// A batch answers {"results": [...]} with one result per event, in order;
// its status is 202 when at least one event was accepted. Validation is all
// or nothing: if any event of a batch is invalid the whole batch is refused
// (each problem carries the event's index) and nothing is written. Events
// whose topic has no consumer are SKIPPED individually; the others are
// written in one statement, so they are all recorded or none is. Error
// bodies are {"error": code, "message": "field: rule; ...", "fields":
// [{"index", "eventId", "field", "rule"}]}.
//
// # Topics and aggregates
//
// An event's aggregateType must be one its topic carries (the topology's
// aggregate_types, else the topic's aggregate segment: shop.order.events
// carries order); an aggregate type belongs to one topic, so a producer
// allowed on one topic cannot take the versions of another topic's
// aggregates. A dead-letter topic (<topic>.dlq) is never published to.
// Both are 400 invalid_event naming the field. docs/security.md has the
// rules.
//
// # Fast path
//
// The outbox write takes the fast path's lease on the aggregates whose new
// rows are their only unpublished ones, in the same statement ([Enqueuer],
// the relay's EnqueueNow); the handler then publishes those rows and
// settles them ([Enqueuer]'s PublishClaimed), and claims the rest with
// their aggregates' earlier pending rows (the relay's PublishNow), which
// never breaks per-aggregate order. A fast path that cannot publish (another relay holds
// the aggregate, an earlier version is blocked, Pub/Sub failed) is not an
// error for the caller: the row is committed and the scheduled relay
// publishes it; the answer says pending.
package publish
