-- Purge: delete up to $2 rows older than $1 from each of the inbox and the
-- attempts the ledger has (an attempt still in the unshipped queue stays).
-- Both are found through their BRIN indexes, keyed by the hour of the
-- time (migration 006): each query names the key as well as the time.
-- (Keep them longer than the subscriptions' message retention, so that a
-- redelivery still finds its inbox row.)
WITH inbox AS (
    DELETE FROM relaybus_inbox WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM relaybus_inbox
        WHERE processed_at < $1 AND relaybus_inbox_hour(processed_at) <= relaybus_inbox_hour($1) LIMIT $2))
    RETURNING 1
), attempts AS (
    DELETE FROM relaybus_attempts WHERE ctid = ANY(ARRAY(
        SELECT a.ctid FROM relaybus_attempts a
        WHERE a.consumed_at < $1 AND relaybus_inbox_hour(a.consumed_at) <= relaybus_inbox_hour($1)
          AND NOT EXISTS (SELECT 1 FROM relaybus_inbox_unshipped q
                          WHERE q.consumer_id = a.consumer_id AND q.event_id = a.event_id AND q.attempt_no = a.attempt_no)
        LIMIT $2))
    RETURNING 1
)
SELECT (SELECT count(*) FROM inbox), (SELECT count(*) FROM attempts)
