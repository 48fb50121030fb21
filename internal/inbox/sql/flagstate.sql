-- $1 consumer, $2 topic: the flag's row, if any.
SELECT breaker, paused_by, reason, paused_at, probe_after, failed_probes
FROM relaybus_inbox_pause WHERE consumer_id = $1 AND topic = $2
