-- Mark an aggregate's parked events as stalled behind a missing version
-- (once per missing version) and return the ones marked now, for their
-- stalled attempts.
--
-- $1 consumer, $2 aggregate type, $3 aggregate id, $4 missing version.
UPDATE relaybus_strict_parked SET stalled_for = $4
WHERE consumer_id = $1 AND aggregate_type = $2 AND aggregate_id = $3 AND stalled_for IS DISTINCT FROM $4
RETURNING version, event_id, topic, subscription, message_id, delivery_attempt
