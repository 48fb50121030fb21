-- Claim sends to record: aggregates whose published versions the ledger
-- may not have recorded (ledger_due_at passed: the live recorder had its
-- chance), leased to this healing step for $3 seconds, with the rows
-- between the ledger's cursor and the published one (at most $4 each).
-- An aggregate with nothing left to record comes back with no row. A
-- cancelled version (outbox.Cancel) was never sent: it is not recorded.
--
-- $1 now (NULL: the database's clock), $2 aggregates, $3 lease in
-- seconds, $4 rows per aggregate.
WITH t AS (
    SELECT coalesce($1::timestamptz, now()) AS now
), due AS (
    SELECT d.aggregatetype, d.aggregateid FROM relaybus_outbox_dispatch d, t
    WHERE d.ledger_due_at <= t.now
    ORDER BY d.ledger_due_at
    LIMIT $2
    FOR UPDATE OF d SKIP LOCKED
), leased AS (
    UPDATE relaybus_outbox_dispatch d SET ledger_due_at = t.now + make_interval(secs => $3)
    FROM due, t
    WHERE d.aggregatetype = due.aggregatetype AND d.aggregateid = due.aggregateid
    RETURNING d.aggregatetype, d.aggregateid, d.ledger_version, d.published_version
)
SELECT l.aggregatetype, l.aggregateid, l.ledger_version, l.published_version,
       o.id, o.event_type, o.version, o.payload, o.occurred_at, o.topic, o.source, o.schema_version,
       o.payload_type, o.trace_id, o.span_id, o.parent_event_id, o.correlation_id, o.initiator,
       o.expire_at, o.target_consumer, o.created_at, o.traceparent, o.source_version
FROM leased l
LEFT JOIN LATERAL (
    SELECT * FROM relaybus_outbox o
    WHERE o.aggregatetype = l.aggregatetype AND o.aggregateid = l.aggregateid
      AND o.version > l.ledger_version AND o.version <= l.published_version
      AND NOT EXISTS (SELECT 1 FROM relaybus_outbox_cancelled c WHERE c.event_id = o.id)
    ORDER BY o.version
    LIMIT $4
) o ON true
ORDER BY l.aggregatetype, l.aggregateid, o.version
