-- Re-push target: address a FAILED event to one consumer ('' or NULL:
-- every consumer) before its aggregate flows again.
--
-- $1 event id, $2 target consumer.
UPDATE relaybus_outbox SET target_consumer = nullif($2, '') WHERE id = $1
