-- $1 consumer, $2 topic, $3 reason, $4 probe after: a circuit breaker's pause
-- by the consumer's flag, unless a pause stands (the breaker's or an
-- operator's).
INSERT INTO relaybus_inbox_pause (consumer_id, topic, paused_by, breaker, reason, probe_after)
VALUES ($1, $2, 'circuit breaker', true, $3, $4)
ON CONFLICT (consumer_id, topic) DO NOTHING
