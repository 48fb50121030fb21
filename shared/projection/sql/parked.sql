-- The events parked for an aggregate above a version, lowest first.
--
-- $1 consumer, $2 aggregate type, $3 aggregate id, $4 version, $5 limit.
SELECT version, event_id, event, subscription, message_id, delivery_attempt
FROM relaybus_strict_parked
WHERE consumer_id = $1 AND aggregate_type = $2 AND aggregate_id = $3 AND version > $4
ORDER BY version
LIMIT $5
