-- $1 consumer, $2 topic, $3 limit: the oldest kept deliveries, in order.
SELECT seq, message FROM relaybus_inbox_held WHERE consumer_id = $1 AND topic = $2 ORDER BY seq LIMIT $3
