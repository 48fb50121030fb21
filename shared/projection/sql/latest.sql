-- The generic projection: upsert the aggregate's state when the event's
-- version is newer than the one held (late or repeated versions change
-- nothing).
--
-- $1 consumer, $2 aggregate type, $3 aggregate id, $4 version, $5 event id,
-- $6 event type, $7 state.
INSERT INTO relaybus_projection (consumer_id, aggregate_type, aggregate_id, version, event_id, event_type, state)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (consumer_id, aggregate_type, aggregate_id) DO UPDATE
SET version = EXCLUDED.version, event_id = EXCLUDED.event_id, event_type = EXCLUDED.event_type,
    state = EXCLUDED.state, updated_at = now()
WHERE relaybus_projection.version < EXCLUDED.version
