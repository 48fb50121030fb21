-- Lock an aggregate's strict position, creating it at version 0, and
-- return the last version applied. Every transaction that applies or parks
-- an event of the aggregate, or releases its gap, takes this row lock
-- first, so they run one at a time per aggregate and each sees what the
-- one before it committed (a new aggregate's first two events included).
--
-- $1 consumer, $2 aggregate type, $3 aggregate id.
INSERT INTO relaybus_strict_position AS p (consumer_id, aggregate_type, aggregate_id, version, event_id)
VALUES ($1, $2, $3, 0, '')
ON CONFLICT (consumer_id, aggregate_type, aggregate_id) DO UPDATE SET version = p.version
RETURNING version
