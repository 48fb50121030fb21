-- What a rebuild would clear of consumer $1's state for aggregate type $2
-- ('' for all): latest-state rows, strict positions, parked and skipped
-- versions.
SELECT (SELECT count(*) FROM relaybus_projection WHERE consumer_id = $1 AND ($2 = '' OR aggregate_type = $2)),
       (SELECT count(*) FROM relaybus_strict_position WHERE consumer_id = $1 AND ($2 = '' OR aggregate_type = $2)),
       (SELECT count(*) FROM relaybus_strict_parked WHERE consumer_id = $1 AND ($2 = '' OR aggregate_type = $2)),
       (SELECT count(*) FROM relaybus_strict_skipped WHERE consumer_id = $1 AND ($2 = '' OR aggregate_type = $2))
