-- Purge: delete up to $2 rows older than $1 from each of the inbox, the
-- attempt counters and the attempts the ledger has. (Keep them longer than
-- the subscriptions' message retention, so that a redelivery still finds
-- its inbox row.)
WITH inbox AS (
    DELETE FROM relaybus_inbox WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM relaybus_inbox WHERE processed_at < $1 LIMIT $2))
    RETURNING 1
), counters AS (
    DELETE FROM relaybus_inbox_attempts WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM relaybus_inbox_attempts WHERE last_at < $1 LIMIT $2))
    RETURNING 1
), attempts AS (
    DELETE FROM relaybus_attempts WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM relaybus_attempts WHERE consumed_at < $1 AND shipped_at IS NOT NULL LIMIT $2))
    RETURNING 1
)
SELECT (SELECT count(*) FROM inbox), (SELECT count(*) FROM counters), (SELECT count(*) FROM attempts)
