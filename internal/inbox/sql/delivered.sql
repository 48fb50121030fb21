-- The claimed call succeeded: the claim becomes 'applied' and the attempt is
-- recorded and queued for the ledger, in one statement, only while this
-- attempt still holds the claim (a claim taken over after its lease ran out
-- belongs to the attempt that took it, which records its own outcome).
--
-- $1 consumer, $2 event id, $3 attempt number, $4 outcome, $5 error code,
-- $6 error message, $7 consumed at, $8 topic, $9 subscription,
-- $10 message id, $11 delivery attempt. Returns the attempt's number when
-- it was recorded.
WITH delivered AS (
    UPDATE relaybus_inbox SET state = 'applied', lease_until = NULL, processed_at = now()
    WHERE consumer_id = $1 AND event_id = $2 AND attempt_no = $3 AND state = 'claimed'
    RETURNING attempt_no
), recorded AS (
    INSERT INTO relaybus_attempts (consumer_id, event_id, attempt_no, outcome, error_code, error_message, consumed_at,
        topic, subscription, message_id, delivery_attempt)
    SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11 FROM delivered
    ON CONFLICT (consumer_id, event_id, attempt_no) DO NOTHING
    RETURNING attempt_no
), queued AS (
    INSERT INTO relaybus_inbox_unshipped (consumer_id, event_id, attempt_no)
    SELECT $1, $2, attempt_no FROM recorded
)
SELECT attempt_no FROM recorded
