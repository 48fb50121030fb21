-- Begin an attempt that records itself: begin.sql, and in the same
-- statement the attempt's row with outcome success, for an attempt whose
-- handler runs in this transaction: a success commits it as it is (one
-- statement per delivery, not two), a parked event corrects it (outcome.sql),
-- a failure rolls it back with everything else. The attempt's number is
-- fresh (the counter's row is locked by this statement), so the insert
-- needs no conflict check.
--
-- $1 consumer, $2 event id, $3 consumed at, $4 topic, $5 subscription,
-- $6 message id, $7 delivery attempt. Returns what begin.sql returns.
WITH counted AS (
    INSERT INTO relaybus_inbox_attempts AS a (consumer_id, event_id, attempts) VALUES ($1, $2, 1)
    ON CONFLICT (consumer_id, event_id) DO UPDATE SET attempts = a.attempts + 1, last_at = now()
    RETURNING attempts
), claimed AS (
    INSERT INTO relaybus_inbox (consumer_id, event_id, attempt_no)
    SELECT $1, $2, attempts FROM counted
    ON CONFLICT (consumer_id, event_id) DO NOTHING
    RETURNING attempt_no
), recorded AS (
    INSERT INTO relaybus_attempts (consumer_id, event_id, attempt_no, outcome, consumed_at,
        topic, subscription, message_id, delivery_attempt)
    SELECT $1, $2, attempt_no, 'success', $3, $4, $5, $6, $7 FROM claimed
)
SELECT (SELECT attempts FROM counted), EXISTS (SELECT 1 FROM claimed),
       (SELECT attempt_no FROM relaybus_inbox WHERE consumer_id = $1 AND event_id = $2)
