-- $1 consumer: the topics it is paused on.
SELECT topic FROM relaybus_inbox_pause WHERE consumer_id = $1
