-- Begin an attempt that records itself: begin.sql, and in the same
-- statement the attempt's row with outcome success and its place in the
-- unshipped queue, for an attempt whose handler runs in this transaction: a
-- success commits them as they are (one statement per delivery, not two), a
-- parked event corrects the outcome (outcome.sql), a failure rolls them back
-- with everything else. The number can be taken already only when a
-- concurrent attempt that failed recorded itself under it while this
-- statement waited on its inbox row: then the attempt's insert fails on
-- the attempts' primary key and the caller rolls back and asks for a
-- redelivery. (A plain insert, not ON CONFLICT DO NOTHING: a speculative
-- insert writes a confirmation record to the WAL on every delivery, for a
-- conflict that almost never happens.)
--
-- The inbox row is a plain insert too, for the same reason: the event is
-- claimed unless its row is there already. A delivery of the same event
-- whose transaction inserted the row and had not committed when this
-- statement's snapshot was taken makes the insert wait for it, then fail
-- on the inbox's primary key when it committed: the caller reads that as
-- applied by another delivery, number unknown (inbox.BeginApplied), as
-- ON CONFLICT DO NOTHING answered it.
--
-- $1 consumer, $2 event id, $3 consumed at, $4 topic, $5 subscription,
-- $6 message id, $7 delivery attempt. Returns what begin.sql returns,
-- whether the attempt was recorded, and its queue row's tuple id (for
-- shipped.sql).
WITH claimed AS (
    INSERT INTO relaybus_inbox (consumer_id, event_id, attempt_no)
    SELECT $1, $2, coalesce((SELECT max(attempt_no) FROM relaybus_attempts WHERE consumer_id = $1 AND event_id = $2), 0) + 1
    WHERE NOT EXISTS (SELECT 1 FROM relaybus_inbox WHERE consumer_id = $1 AND event_id = $2)
    RETURNING attempt_no
), recorded AS (
    INSERT INTO relaybus_attempts (consumer_id, event_id, attempt_no, outcome, consumed_at,
        topic, subscription, message_id, delivery_attempt)
    SELECT $1, $2, attempt_no, 'success', $3, $4, $5, $6, $7 FROM claimed
    RETURNING attempt_no
), queued AS (
    INSERT INTO relaybus_inbox_unshipped (consumer_id, event_id, attempt_no)
    SELECT $1, $2, attempt_no FROM recorded
    RETURNING ctid
)
SELECT (SELECT attempt_no FROM claimed), EXISTS (SELECT 1 FROM claimed),
       (SELECT attempt_no FROM relaybus_inbox WHERE consumer_id = $1 AND event_id = $2),
       EXISTS (SELECT 1 FROM recorded), (SELECT ctid FROM queued)
