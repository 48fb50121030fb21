-- Correct the outcome of an attempt begin_applied.sql recorded as a
-- success, in the same transaction (a handler that parked its event).
--
-- $1 consumer, $2 event id, $3 attempt number, $4 outcome, $5 error code,
-- $6 error message.
UPDATE relaybus_attempts SET outcome = $4, error_code = $5, error_message = $6
WHERE consumer_id = $1 AND event_id = $2 AND attempt_no = $3
