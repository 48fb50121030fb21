-- $1 consumer, $2 topic, $3 message: keep a delivery while the consumer is
-- paused; nothing is kept once the pause is gone (the delivery is handled).
INSERT INTO relaybus_inbox_held (consumer_id, topic, message)
SELECT $1, $2, $3 WHERE EXISTS (SELECT 1 FROM relaybus_inbox_pause WHERE consumer_id = $1 AND topic = $2)
