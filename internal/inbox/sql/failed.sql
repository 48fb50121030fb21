-- A failed attempt of a claim (claim.sql, a remote call): the inbox claim
-- goes (the event was not applied) and the attempt is recorded and queued
-- for the ledger, in one statement.
--
-- $1 consumer, $2 event id, $3 attempt number, $4 outcome, $5 error code,
-- $6 error message, $7 consumed at, $8 topic, $9 subscription,
-- $10 message id, $11 delivery attempt.
WITH unclaimed AS (
    DELETE FROM relaybus_inbox WHERE consumer_id = $1 AND event_id = $2 AND attempt_no = $3
), recorded AS (
    INSERT INTO relaybus_attempts (consumer_id, event_id, attempt_no, outcome, error_code, error_message, consumed_at,
        topic, subscription, message_id, delivery_attempt)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
    ON CONFLICT (consumer_id, event_id, attempt_no) DO NOTHING
    RETURNING attempt_no
)
INSERT INTO relaybus_inbox_unshipped (consumer_id, event_id, attempt_no)
SELECT $1, $2, attempt_no FROM recorded
