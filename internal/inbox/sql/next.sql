-- Count one more attempt of the consumer at an event it already holds (a
-- parked event applied in another event's transaction), in that
-- transaction, and return the attempt's number. The counter's row is taken
-- before the inbox row is touched (settle.sql), the order every attempt
-- follows (begin.sql, claim.sql), so these never deadlock.
--
-- $1 consumer, $2 event id.
INSERT INTO relaybus_inbox_attempts AS a (consumer_id, event_id, attempts) VALUES ($1, $2, 1)
ON CONFLICT (consumer_id, event_id) DO UPDATE SET attempts = a.attempts + 1, last_at = now()
RETURNING attempts
