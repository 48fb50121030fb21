-- $1 consumer, $2 topic: lift a circuit breaker's pause (never an operator's).
DELETE FROM relaybus_inbox_pause WHERE consumer_id = $1 AND topic = $2 AND breaker
