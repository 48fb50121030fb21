-- Claim re-pushes: lease up to $3 due re-pushes for $2 seconds (an expired
-- lease makes one due again) and return each with its event's row (NULL
-- columns when retention has deleted it since). A row retention moved to
-- the history (migration 009) is found there: that is how a backfill's
-- events go out.
--
-- $1 now (NULL: the database's clock), $2 lease in seconds, $3 limit.
WITH t AS (
    SELECT coalesce($1::timestamptz, now()) AS now
), due AS (
    SELECT q.id FROM relaybus_outbox_repush q, t
    WHERE q.failed_at IS NULL AND q.due_at <= t.now
    ORDER BY q.due_at, q.id
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
LEFT JOIN LATERAL (
    SELECT o.id, o.aggregatetype, o.aggregateid, o.event_type, o.version, o.payload, o.occurred_at,
           o.topic, o.source, o.schema_version, o.payload_type, o.trace_id, o.span_id, o.parent_event_id,
           o.correlation_id, o.initiator, o.expire_at, o.target_consumer, o.created_at, o.traceparent,
           o.source_version
    FROM relaybus_outbox o WHERE o.id = l.event_id
    UNION ALL
    SELECT h.id, h.aggregatetype, h.aggregateid, h.event_type, h.version, h.payload, h.occurred_at,
           h.topic, h.source, h.schema_version, h.payload_type, h.trace_id, h.span_id, h.parent_event_id,
           h.correlation_id, h.initiator, h.expire_at, h.target_consumer, h.created_at, h.traceparent,
           h.source_version
    FROM relaybus_outbox_history h WHERE h.id = l.event_id
    LIMIT 1
) o ON true
ORDER BY l.id
