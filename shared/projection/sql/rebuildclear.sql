-- A rebuild clears consumer $1's state for aggregate type $2 ('' for all),
-- so that the redelivered versions pass the version gate again: the same
-- rows rebuildcount.sql counts, deleted.
WITH projection AS (
    DELETE FROM relaybus_projection WHERE consumer_id = $1 AND ($2 = '' OR aggregate_type = $2) RETURNING 1
), positions AS (
    DELETE FROM relaybus_strict_position WHERE consumer_id = $1 AND ($2 = '' OR aggregate_type = $2) RETURNING 1
), parked AS (
    DELETE FROM relaybus_strict_parked WHERE consumer_id = $1 AND ($2 = '' OR aggregate_type = $2) RETURNING 1
), skipped AS (
    DELETE FROM relaybus_strict_skipped WHERE consumer_id = $1 AND ($2 = '' OR aggregate_type = $2) RETURNING 1
)
SELECT (SELECT count(*) FROM projection), (SELECT count(*) FROM positions), (SELECT count(*) FROM parked), (SELECT count(*) FROM skipped)
