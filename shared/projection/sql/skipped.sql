-- Whether an operator skipped this version of the aggregate.
--
-- $1 consumer, $2 aggregate type, $3 aggregate id, $4 version.
SELECT EXISTS (SELECT 1 FROM relaybus_strict_skipped
               WHERE consumer_id = $1 AND aggregate_type = $2 AND aggregate_id = $3 AND version = $4)
