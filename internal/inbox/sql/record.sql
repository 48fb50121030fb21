-- Record an attempt. Number 0 takes the next number of the consumer's
-- counter, in the same statement (a failed attempt, after its transaction
-- rolled back). An attempt already recorded is left as it is.
--
-- $1 consumer, $2 event id, $3 attempt number (0: the next), $4 outcome,
-- $5 error code, $6 error message, $7 consumed at, $8 topic,
-- $9 subscription, $10 message id, $11 delivery attempt. Returns the
-- attempt's number when it was recorded.
WITH counted AS (
    INSERT INTO relaybus_inbox_attempts AS a (consumer_id, event_id, attempts)
    SELECT $1, $2, 1 WHERE $3::integer = 0
    ON CONFLICT (consumer_id, event_id) DO UPDATE SET attempts = a.attempts + 1, last_at = now()
    RETURNING attempts
)
INSERT INTO relaybus_attempts (consumer_id, event_id, attempt_no, outcome, error_code, error_message, consumed_at,
    topic, subscription, message_id, delivery_attempt)
SELECT $1, $2, coalesce((SELECT attempts FROM counted), $3::integer), $4, $5, $6, $7, $8, $9, $10, $11
ON CONFLICT (consumer_id, event_id, attempt_no) DO NOTHING
RETURNING attempt_no
