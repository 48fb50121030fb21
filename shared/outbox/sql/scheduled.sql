-- Scheduled: unpublished, uncancelled scheduled events by deliver_at (the
-- partial index relaybus_outbox_scheduled), after the page cursor
-- ($1 deliver_at, $2 id; NULL: from the start), at most $3. due says the
-- time has come (the relay publishes it, unless an earlier version of its
-- aggregate still holds it).
SELECT o.id, o.aggregatetype, o.aggregateid, o.version, o.topic, o.event_type, o.deliver_at, o.created_at,
       o.deliver_at <= now() AS due
FROM relaybus_outbox o
JOIN relaybus_outbox_dispatch d ON d.aggregatetype = o.aggregatetype AND d.aggregateid = o.aggregateid
WHERE o.deliver_at IS NOT NULL
  AND ($1::timestamptz IS NULL OR (o.deliver_at, o.id) > ($1::timestamptz, $2::text))
  AND o.version > d.published_version
  AND NOT EXISTS (SELECT 1 FROM relaybus_outbox_cancelled c WHERE c.event_id = o.id)
ORDER BY o.deliver_at, o.id
LIMIT $3
