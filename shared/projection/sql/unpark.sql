-- A parked event was applied (or failed for good when its turn came).
--
-- $1 consumer, $2 aggregate type, $3 aggregate id, $4 version.
DELETE FROM relaybus_strict_parked
WHERE consumer_id = $1 AND aggregate_type = $2 AND aggregate_id = $3 AND version = $4
