-- Oldest: seconds since the oldest unpublished row was committed (0 when
-- none): the head of every aggregate with work (due, leased, retrying or
-- FAILED), each found through the (aggregate, version) index.
SELECT coalesce(extract(epoch FROM now() - min(h.created_at)), 0)::float8
FROM relaybus_outbox_dispatch d
CROSS JOIN LATERAL (
    SELECT o.created_at FROM relaybus_outbox o
    WHERE o.aggregatetype = d.aggregatetype AND o.aggregateid = d.aggregateid
      AND o.version > d.published_version
    ORDER BY o.version
    LIMIT 1
) h
WHERE d.due_at IS NOT NULL OR d.failed_version IS NOT NULL
