-- $1 consumer, $2 topic: whether it is paused, how many deliveries are kept,
-- and whether the pause is a circuit breaker's.
SELECT EXISTS (SELECT 1 FROM relaybus_inbox_pause WHERE consumer_id = $1 AND topic = $2),
       (SELECT count(*) FROM relaybus_inbox_held WHERE consumer_id = $1 AND topic = $2),
       COALESCE((SELECT breaker FROM relaybus_inbox_pause WHERE consumer_id = $1 AND topic = $2), false)
