-- The inbox row of an event for a consumer, if any: the attempt that
-- holds it (dlqreplay's dry run reads it to say whether a replay would be
-- a duplicate).
--
-- $1 consumer, $2 event id.
SELECT attempt_no FROM relaybus_inbox WHERE consumer_id = $1 AND event_id = $2
