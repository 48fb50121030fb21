-- Attempts the ledger does not have, committed before $1, oldest first, at
-- most $2 (across every consumer of the database when $3 is empty, else
-- that consumer's), locked so that two shipping steps do not ship the same.
SELECT consumer_id, event_id, attempt_no, outcome, error_code, error_message, consumed_at,
       topic, subscription, message_id, delivery_attempt
FROM relaybus_attempts
WHERE shipped_at IS NULL AND consumed_at < $1 AND ($3 = '' OR consumer_id = $3)
ORDER BY seq
LIMIT $2
FOR UPDATE SKIP LOCKED
