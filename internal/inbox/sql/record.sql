-- Record an attempt and queue it for the ledger. Number 0 takes the next
-- number after the highest the consumer has used for the event (the inbox
-- row's, the recorded attempts'), in the same statement (a failed attempt,
-- after its transaction rolled back). An attempt already recorded is left
-- as it is; so is a number 0 whose number a concurrent attempt took first
-- (the caller tries again, with a fresh snapshot).
--
-- $1 consumer, $2 event id, $3 attempt number (0: the next), $4 outcome,
-- $5 error code, $6 error message, $7 consumed at, $8 topic,
-- $9 subscription, $10 message id, $11 delivery attempt. Returns the
-- attempt's number when it was recorded.
WITH recorded AS (
    INSERT INTO relaybus_attempts (consumer_id, event_id, attempt_no, outcome, error_code, error_message, consumed_at,
        topic, subscription, message_id, delivery_attempt)
    SELECT $1, $2,
           CASE WHEN $3::integer > 0 THEN $3::integer
                ELSE greatest((SELECT max(attempt_no) FROM relaybus_attempts WHERE consumer_id = $1 AND event_id = $2),
                              (SELECT attempt_no FROM relaybus_inbox WHERE consumer_id = $1 AND event_id = $2), 0) + 1 END,
           $4, $5, $6, $7, $8, $9, $10, $11
    ON CONFLICT (consumer_id, event_id, attempt_no) DO NOTHING
    RETURNING attempt_no
), queued AS (
    INSERT INTO relaybus_inbox_unshipped (consumer_id, event_id, attempt_no)
    SELECT $1, $2, attempt_no FROM recorded
)
SELECT attempt_no FROM recorded
