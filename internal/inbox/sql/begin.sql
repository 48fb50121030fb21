-- Begin an attempt, in the handler's transaction: claim the event in the
-- inbox with the attempt's number, the next after the highest the consumer
-- has used for the event (its recorded attempts; the inbox row is absent
-- here). The inbox row is there already when the event was applied before:
-- then nothing is claimed (the caller rolls back). A concurrent delivery of
-- the same event waits here on the inbox row until this transaction ends,
-- then finds it.
--
-- $1 consumer, $2 event id. Returns the attempt number (NULL when nothing
-- was claimed), whether the inbox row was claimed and, when it was not, the
-- number of the attempt that applied the event (NULL when that row
-- committed after this statement's snapshot).
WITH claimed AS (
    INSERT INTO relaybus_inbox (consumer_id, event_id, attempt_no)
    SELECT $1, $2, coalesce((SELECT max(attempt_no) FROM relaybus_attempts WHERE consumer_id = $1 AND event_id = $2), 0) + 1
    ON CONFLICT (consumer_id, event_id) DO NOTHING
    RETURNING attempt_no
)
SELECT (SELECT attempt_no FROM claimed), EXISTS (SELECT 1 FROM claimed),
       (SELECT attempt_no FROM relaybus_inbox WHERE consumer_id = $1 AND event_id = $2)
