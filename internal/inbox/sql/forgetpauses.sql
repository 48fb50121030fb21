-- $1 consumer, $2 topic, $3 subscription: a removed consumer's pause
-- state: its flag, the deliveries its flag kept, its push pause record.
WITH flag AS (
  DELETE FROM relaybus_inbox_pause WHERE consumer_id = $1 AND topic = $2
), held AS (
  DELETE FROM relaybus_inbox_held WHERE consumer_id = $1 AND topic = $2
)
DELETE FROM relaybus_inbox_push_pause WHERE subscription = $3
