-- Purge: delete up to $2 outbox rows committed before $1 that are
-- published, recorded by the ledger when $3, and wanted by no pending
-- re-push, in the order the outbox's BRIN index (on the hour of
-- created_at) finds them (block ranges in physical order, which is about
-- the order of insertion). A deleted
-- row's cancel record (relaybus_outbox_cancelled) goes with it. Returns
-- how many outbox rows it deleted.
--
-- History (migration 009): a deleted row whose topic keeps history is
-- moved to relaybus_outbox_history in the same statement, kept until its
-- topic's retention has passed: $4 topics, $5 their retention in seconds,
-- $6 the retention of any other topic (0: no history). A cancelled row is
-- not history (it was never published). This INSERT is the one place an
-- event's payload is written to history. It also returns the ids of the
-- rows it moved of the topics $7, whose payloads the caller rewrites in the
-- same transaction (History.Keep: a privacy rule's redaction).
WITH gone AS (
DELETE FROM relaybus_outbox WHERE id IN (
    SELECT o.id
    FROM relaybus_outbox o
    JOIN relaybus_outbox_dispatch d ON d.aggregatetype = o.aggregatetype AND d.aggregateid = o.aggregateid
    WHERE o.created_at < $1
      -- the retention index's key (migration 010), for the index to find
      -- the old ranges
      AND relaybus_outbox_hour(o.created_at) <= relaybus_outbox_hour($1)
      AND o.version <= d.published_version
      AND (NOT $3 OR o.version <= d.ledger_version)
      AND NOT EXISTS (SELECT 1 FROM relaybus_outbox_repush q WHERE q.event_id = o.id AND q.failed_at IS NULL)
    LIMIT $2
)
RETURNING *
), cancels AS (
    DELETE FROM relaybus_outbox_cancelled c USING gone WHERE c.event_id = gone.id
    RETURNING c.event_id
), kept AS (
    SELECT g.*, coalesce(k.secs, $6::double precision) AS secs
    FROM gone g
    LEFT JOIN unnest($4::text[], $5::double precision[]) AS k(topic, secs) ON k.topic = g.topic
), history AS (
    INSERT INTO relaybus_outbox_history (id, aggregatetype, aggregateid, event_type, version, payload, occurred_at,
        topic, source, schema_version, payload_type, trace_id, span_id, parent_event_id, correlation_id, initiator,
        expire_at, target_consumer, created_at, traceparent, source_version, archived_at, keep_until)
    SELECT k.id, k.aggregatetype, k.aggregateid, k.event_type, k.version, k.payload, k.occurred_at,
        k.topic, k.source, k.schema_version, k.payload_type, k.trace_id, k.span_id, k.parent_event_id, k.correlation_id, k.initiator,
        k.expire_at, k.target_consumer, k.created_at, k.traceparent, k.source_version, now(),
        now() + make_interval(secs => k.secs)
    FROM kept k
    WHERE k.secs > 0 AND k.id NOT IN (SELECT event_id FROM cancels)
    RETURNING id, topic
)
SELECT (SELECT count(*) FROM gone),
    (SELECT coalesce(array_agg(id), '{}') FROM history WHERE topic = ANY($7::text[]))
