-- Record versions an operator skipped (never applied).
--
-- $1 consumer, $2 aggregate type, $3 aggregate id, $4 first version,
-- $5 last version, $6 by, $7 reason.
INSERT INTO relaybus_strict_skipped (consumer_id, aggregate_type, aggregate_id, version, skipped_by, reason)
SELECT $1, $2, $3, v, $6, $7 FROM generate_series($4::bigint, $5::bigint) AS v
ON CONFLICT (consumer_id, aggregate_type, aggregate_id, version) DO NOTHING
