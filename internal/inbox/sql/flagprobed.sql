-- $1 consumer, $2 topic, $3 probe after, $4 reason: a failed probe of a
-- circuit breaker's pause (an operator's is left as it is).
UPDATE relaybus_inbox_pause SET failed_probes = failed_probes + 1, probe_after = $3, reason = $4
WHERE consumer_id = $1 AND topic = $2 AND breaker
