-- $1 subscription, $2 consumer, $3 who: an operator's pause; it takes over a
-- breaker's (which the probe then leaves alone).
INSERT INTO relaybus_inbox_push_pause (subscription, consumer_id, paused_by, who)
VALUES ($1, $2, 'operator', $3)
ON CONFLICT (subscription) DO UPDATE SET paused_by = 'operator', who = EXCLUDED.who, paused_at = now()
