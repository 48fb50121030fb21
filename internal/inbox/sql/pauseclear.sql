-- $1 consumer, $2 topic: resume.
DELETE FROM relaybus_inbox_pause WHERE consumer_id = $1 AND topic = $2
