-- Record an attempt at an event the consumer already holds in its inbox
-- (claimed by an earlier attempt: a parked event), in the transaction that
-- settles it, queue it for the ledger, and bring the inbox row in line
-- with the outcome: success makes the row name this attempt (the one that
-- applied the event); a final failure (failed, poison, dead_lettered)
-- deletes the row, so that a replay or a re-push can apply the event; any
-- other outcome (retry, parked, stalled) leaves it. The caller numbers the
-- attempt (next.sql, after lock.sql). An attempt already recorded is left
-- as it is.
--
-- $1 consumer, $2 event id, $3 attempt number, $4 outcome, $5 error code,
-- $6 error message, $7 consumed at, $8 topic, $9 subscription,
-- $10 message id, $11 delivery attempt. Returns the attempt's number when
-- it was recorded.
WITH applied AS (
    UPDATE relaybus_inbox SET attempt_no = $3, state = 'applied', lease_until = NULL,
        processed_at = now()
    WHERE consumer_id = $1 AND event_id = $2 AND $4::text = 'success'
), released AS (
    DELETE FROM relaybus_inbox
    WHERE consumer_id = $1 AND event_id = $2 AND $4::text IN ('failed', 'poison', 'dead_lettered')
), recorded AS (
    INSERT INTO relaybus_attempts (consumer_id, event_id, attempt_no, outcome, error_code, error_message, consumed_at,
        topic, subscription, message_id, delivery_attempt)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
    ON CONFLICT (consumer_id, event_id, attempt_no) DO NOTHING
    RETURNING attempt_no
), queued AS (
    INSERT INTO relaybus_inbox_unshipped (consumer_id, event_id, attempt_no)
    SELECT $1, $2, attempt_no FROM recorded
)
SELECT attempt_no FROM recorded
