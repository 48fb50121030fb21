-- Attempts the ledger does not have (the unshipped queue), committed before
-- $1, at most $2 (across every consumer of the database when $3 is empty,
-- else that consumer's), their queue rows locked so that two shipping steps
-- do not ship the same; with each queue row's tuple id, for Shipped.
SELECT a.consumer_id, a.event_id, a.attempt_no, a.outcome, a.error_code, a.error_message, a.consumed_at,
       a.topic, a.subscription, a.message_id, a.delivery_attempt, q.ctid
FROM relaybus_inbox_unshipped q
JOIN relaybus_attempts a
  ON a.consumer_id = q.consumer_id AND a.event_id = q.event_id AND a.attempt_no = q.attempt_no
WHERE a.consumed_at < $1 AND ($3 = '' OR q.consumer_id = $3)
LIMIT $2
FOR UPDATE OF q SKIP LOCKED
