-- The consumer's open gaps, oldest first: per aggregate with parked events,
-- the last version applied, the lowest parked version, how many are
-- parked, since when the oldest waits, and whether the gap at the current
-- missing version was reported (every parked event's stalled_for is it).
--
-- $1 consumer, $2 limit, $3 aggregate id ('' for all), $4 aggregate type
-- ('' for all).
SELECT k.aggregate_type, k.aggregate_id, coalesce(p.version, 0), min(k.version), count(*), min(k.parked_at),
       bool_and(k.stalled_for IS NOT DISTINCT FROM coalesce(p.version, 0) + 1)
FROM relaybus_strict_parked k
LEFT JOIN relaybus_strict_position p
       ON p.consumer_id = k.consumer_id AND p.aggregate_type = k.aggregate_type AND p.aggregate_id = k.aggregate_id
WHERE k.consumer_id = $1 AND ($3 = '' OR k.aggregate_id = $3) AND ($4 = '' OR k.aggregate_type = $4)
GROUP BY k.aggregate_type, k.aggregate_id, p.version
ORDER BY min(k.parked_at), k.aggregate_type, k.aggregate_id
LIMIT $2
