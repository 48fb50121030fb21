-- The generic projection: upsert the aggregate's state when the event's
-- version is newer than the one held (late or repeated versions change
-- nothing). It returns the version held before (0: none) when the event
-- was applied, and no row when it was not (the projection held it or a
-- newer one): the version gap telemetry records.
--
-- held locks the aggregate's row before the upsert reads it (the INSERT's
-- SELECT reads held, so held runs first): under READ COMMITTED a
-- concurrent apply of the same aggregate is waited for and its version is
-- the one returned, the one the upsert compares with.
--
-- $1 consumer, $2 aggregate type, $3 aggregate id, $4 version, $5 event id,
-- $6 event type, $7 state.
WITH held AS (
    SELECT version FROM relaybus_projection
    WHERE consumer_id = $1 AND aggregate_type = $2 AND aggregate_id = $3
    FOR UPDATE
)
INSERT INTO relaybus_projection (consumer_id, aggregate_type, aggregate_id, version, event_id, event_type, state)
SELECT $1::text, $2::text, $3::text, $4::bigint, $5::text, $6::text, $7::jsonb
FROM (VALUES (1)) AS one LEFT JOIN held ON true
ON CONFLICT (consumer_id, aggregate_type, aggregate_id) DO UPDATE
SET version = EXCLUDED.version, event_id = EXCLUDED.event_id, event_type = EXCLUDED.event_type,
    state = EXCLUDED.state, updated_at = now()
WHERE relaybus_projection.version < EXCLUDED.version
RETURNING coalesce((SELECT version FROM held), 0)
