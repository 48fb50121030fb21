-- The version a latest-state projection holds for an aggregate (no row:
-- none yet).
--
-- $1 consumer, $2 aggregate type, $3 aggregate id.
SELECT version FROM relaybus_projection WHERE consumer_id = $1 AND aggregate_type = $2 AND aggregate_id = $3
