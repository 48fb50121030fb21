-- $1 consumer, $2 topic, $3 seq: a kept delivery was published again.
DELETE FROM relaybus_inbox_held WHERE consumer_id = $1 AND topic = $2 AND seq = $3
