-- $1 consumer, $2 topic, $3 who: an operator's pause (a row), reporting
-- whether it changed anything: a new row, or a circuit breaker's row taken
-- over (which consume's probe then leaves alone).
INSERT INTO relaybus_inbox_pause (consumer_id, topic, paused_by) VALUES ($1, $2, $3)
ON CONFLICT (consumer_id, topic) DO UPDATE SET paused_by = EXCLUDED.paused_by, breaker = false, paused_at = now()
WHERE relaybus_inbox_pause.breaker
