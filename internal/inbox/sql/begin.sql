-- Begin an attempt, in the handler's transaction: count one more attempt of
-- the consumer at the event and claim the event in the inbox with that
-- number. The inbox row is there already when the event was applied
-- before: then nothing is claimed (the caller rolls back, which undoes the
-- count too). A concurrent delivery of the same event waits here on the
-- counter's row until this transaction ends, then finds the inbox row.
--
-- $1 consumer, $2 event id. Returns the attempt number, whether the inbox
-- row was claimed and, when it was not, the number of the attempt that
-- applied the event (NULL when that row committed after this statement's
-- snapshot).
WITH counted AS (
    INSERT INTO relaybus_inbox_attempts AS a (consumer_id, event_id, attempts) VALUES ($1, $2, 1)
    ON CONFLICT (consumer_id, event_id) DO UPDATE SET attempts = a.attempts + 1, last_at = now()
    RETURNING attempts
), claimed AS (
    INSERT INTO relaybus_inbox (consumer_id, event_id, attempt_no)
    SELECT $1, $2, attempts FROM counted
    ON CONFLICT (consumer_id, event_id) DO NOTHING
    RETURNING attempt_no
)
SELECT (SELECT attempts FROM counted), EXISTS (SELECT 1 FROM claimed),
       (SELECT attempt_no FROM relaybus_inbox WHERE consumer_id = $1 AND event_id = $2)
