-- $1 subscription, $2 consumer, $3 endpoint, $4 service account, $5 audience,
-- $6 reason, $7 probe after: the breaker's pause, unless someone's stands.
INSERT INTO relaybus_inbox_push_pause (subscription, consumer_id, paused_by, who, endpoint, service_account, audience, reason, probe_after)
VALUES ($1, $2, 'breaker', 'circuit breaker', $3, $4, $5, $6, $7)
ON CONFLICT (subscription) DO NOTHING
