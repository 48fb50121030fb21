-- The events in the consumer's outbox (the child events its handler
-- emitted, or events a test enqueued), in the order they were enqueued.
SELECT id, event_type, source, topic, aggregatetype, aggregateid, version, occurred_at, schema_version,
       payload_type, payload, trace_id, span_id, parent_event_id, correlation_id, initiator, expire_at
FROM relaybus_outbox
ORDER BY seq
