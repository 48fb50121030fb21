-- Move an aggregate's strict position (locked by position.sql) to the
-- version just applied or skipped.
--
-- $1 consumer, $2 aggregate type, $3 aggregate id, $4 version, $5 event id
-- ('' for a skipped version).
UPDATE relaybus_strict_position SET version = $4, event_id = $5, updated_at = now()
WHERE consumer_id = $1 AND aggregate_type = $2 AND aggregate_id = $3
