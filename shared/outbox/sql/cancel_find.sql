-- Cancel find: the event's aggregate, version and deliver_at, whether it
-- is cancelled already, its aggregate's published cursor, and the
-- aggregate's first unpublished version (the head); the dispatch row is
-- locked, so a cancel and a claim (or a producer) of the aggregate take
-- turns. No row: the event is not in this outbox.
--
-- $1 event id.
SELECT o.aggregatetype, o.aggregateid, o.version, o.deliver_at, o.deliver_at > now(),
       EXISTS (SELECT 1 FROM relaybus_outbox_cancelled c WHERE c.event_id = o.id),
       d.published_version,
       (SELECT min(h.version) FROM relaybus_outbox h
         WHERE h.aggregatetype = o.aggregatetype AND h.aggregateid = o.aggregateid
           AND h.version > d.published_version)
FROM relaybus_outbox o
JOIN relaybus_outbox_dispatch d ON d.aggregatetype = o.aggregatetype AND d.aggregateid = o.aggregateid
WHERE o.id = $1
FOR UPDATE OF d
