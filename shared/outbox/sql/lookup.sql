-- Lookup: each event's dispatch state. Published: at or below its
-- aggregate's cursor, and no re-push of it waits; FAILED: the version its
-- aggregate failed at; pending: anything else (waiting, retrying, leased,
-- or behind a FAILED version, or scheduled); cancelled: a scheduled event
-- cancelled before it was due (outbox.Cancel). Attempts and the last error belong to the
-- aggregate's first unpublished version.
--
-- $1 event ids.
SELECT o.id, o.aggregatetype, o.aggregateid, o.version, o.topic, o.trace_id,
       coalesce(d.published_version, 0) >= o.version AND r.event_id IS NULL AS published,
       d.failed_version IS NOT DISTINCT FROM o.version AS failed,
       d.published_at,
       CASE WHEN o.version = coalesce(d.published_version, 0) + 1 THEN coalesce(d.attempts, 0) ELSE 0 END AS attempts,
       CASE WHEN o.version = coalesce(d.published_version, 0) + 1 THEN coalesce(d.last_error, '') ELSE '' END AS last_error,
       coalesce(r.target_consumer, o.target_consumer, '') AS target,
       o.deliver_at,
       EXISTS (SELECT 1 FROM relaybus_outbox_cancelled c WHERE c.event_id = o.id) AS cancelled
FROM relaybus_outbox o
LEFT JOIN relaybus_outbox_dispatch d ON d.aggregatetype = o.aggregatetype AND d.aggregateid = o.aggregateid
LEFT JOIN LATERAL (
    SELECT q.event_id, q.target_consumer FROM relaybus_outbox_repush q
    WHERE q.event_id = o.id AND q.failed_at IS NULL
    ORDER BY q.id DESC LIMIT 1
) r ON true
WHERE o.id = ANY($1::text[])
