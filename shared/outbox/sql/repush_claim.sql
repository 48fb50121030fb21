-- Claim re-pushes: lease up to $3 due re-pushes for $2 seconds (an expired
-- lease makes one due again) and return each with its event's row (NULL
-- columns when retention has deleted it since).
--
-- $1 now (NULL: the database's clock), $2 lease in seconds, $3 limit.
WITH t AS (
    SELECT coalesce($1::timestamptz, now()) AS now
), due AS (
    SELECT q.id FROM relaybus_outbox_repush q, t
    WHERE q.failed_at IS NULL AND q.due_at <= t.now
    ORDER BY q.due_at
    LIMIT $3
    FOR UPDATE OF q SKIP LOCKED
), leased AS (
    UPDATE relaybus_outbox_repush q SET due_at = t.now + make_interval(secs => $2)
    FROM due, t WHERE q.id = due.id
    RETURNING q.id, q.event_id, q.target_consumer, q.attempts
)
SELECT l.id, l.event_id, coalesce(l.target_consumer, ''), l.attempts,
       o.id IS NOT NULL, o.aggregatetype, o.aggregateid, o.event_type, o.version, o.payload, o.occurred_at,
       o.topic, o.source, o.schema_version, o.payload_type, o.trace_id, o.span_id, o.parent_event_id,
       o.correlation_id, o.initiator, o.expire_at, o.target_consumer, o.created_at, o.traceparent,
       o.source_version
FROM leased l
LEFT JOIN relaybus_outbox o ON o.id = l.event_id
ORDER BY l.id
