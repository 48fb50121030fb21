-- The last version a strict consumer applied for an aggregate (no row:
-- none yet), read without the position lock strict.go's transactions take.
--
-- $1 consumer, $2 aggregate type, $3 aggregate id.
SELECT version FROM relaybus_strict_position WHERE consumer_id = $1 AND aggregate_type = $2 AND aggregate_id = $3
