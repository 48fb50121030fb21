-- Move an aggregate's strict position (locked by position.sql) to the
-- version just applied or skipped, and say whether the version after it is
-- parked (when it is not, a drain would apply nothing, so the handler
-- skips reading the parked events: live versions parked far ahead while a
-- backfill applies their predecessors cost no read per event). The lock is
-- held since position.sql, so this statement's snapshot sees every event
-- parked for the aggregate, and none can be parked until the transaction
-- ends.
--
-- $1 consumer, $2 aggregate type, $3 aggregate id, $4 version, $5 event id
-- ('' for a skipped version).
UPDATE relaybus_strict_position SET version = $4, event_id = $5, updated_at = now()
WHERE consumer_id = $1 AND aggregate_type = $2 AND aggregate_id = $3
RETURNING EXISTS (SELECT 1 FROM relaybus_strict_parked
                 WHERE consumer_id = $1 AND aggregate_type = $2 AND aggregate_id = $3 AND version = $4 + 1)
