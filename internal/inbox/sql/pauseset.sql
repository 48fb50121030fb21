-- $1 consumer, $2 topic, $3 who: pause (a row), reporting whether it was new.
INSERT INTO relaybus_inbox_pause (consumer_id, topic, paused_by) VALUES ($1, $2, $3)
ON CONFLICT (consumer_id, topic) DO NOTHING
