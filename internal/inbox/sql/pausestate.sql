-- $1 consumer, $2 topic: whether it is paused, and how many deliveries are kept.
SELECT EXISTS (SELECT 1 FROM relaybus_inbox_pause WHERE consumer_id = $1 AND topic = $2),
       (SELECT count(*) FROM relaybus_inbox_held WHERE consumer_id = $1 AND topic = $2)
