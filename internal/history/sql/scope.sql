-- The events a backfill reads, in the order it queues them: the published
-- events of a topic (the outbox's rows its aggregate's cursor has passed,
-- less cancelled ones, and the history's), that occurred in [since, until),
-- of the given aggregate ids (all when none), not addressed to another
-- consumer, after the cursor (aggregate type, aggregate id, version).
--
-- $1 topic, $2 since, $3 until, $4 aggregate ids, $5 consumer,
-- $6..$8 the cursor, $9 limit (NULL: all).
SELECT e.id, e.aggregatetype, e.aggregateid, e.version
FROM (
    SELECT o.id, o.aggregatetype, o.aggregateid, o.version, o.occurred_at, o.topic, o.target_consumer
    FROM relaybus_outbox o
    JOIN relaybus_outbox_dispatch d ON d.aggregatetype = o.aggregatetype AND d.aggregateid = o.aggregateid
    WHERE o.version <= d.published_version
      AND NOT EXISTS (SELECT 1 FROM relaybus_outbox_cancelled x WHERE x.event_id = o.id)
    UNION ALL
    SELECT h.id, h.aggregatetype, h.aggregateid, h.version, h.occurred_at, h.topic, h.target_consumer
    FROM relaybus_outbox_history h
) e
WHERE e.topic = $1 AND e.occurred_at >= $2 AND e.occurred_at < $3
  AND (cardinality($4::text[]) = 0 OR e.aggregateid = ANY ($4::text[]))
  AND (e.target_consumer IS NULL OR e.target_consumer = $5)
  AND (e.aggregatetype, e.aggregateid, e.version) > ($6::text, $7::text, $8::bigint)
ORDER BY e.aggregatetype, e.aggregateid, e.version
LIMIT $9
