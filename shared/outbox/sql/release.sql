-- Release: end leases without moving the cursor (a run that was not
-- published, or a settle that found the cursor moved under it). The
-- aggregate is due again at once unless it is FAILED. Only the lease's own
-- epoch releases it.
--
-- $1 now (NULL: the database's clock), $2 types, $3 ids, $4 epochs.
WITH t AS (
    SELECT coalesce($1::timestamptz, now()) AS now
)
UPDATE relaybus_outbox_dispatch d SET
    lease_owner = NULL, lease_expires_at = NULL,
    due_at = CASE WHEN d.failed_version IS NOT NULL THEN NULL
                  WHEN d.enqueued_version > d.published_version THEN t.now
                  ELSE NULL END
FROM unnest($2::text[], $3::text[], $4::bigint[]) AS m(aggregatetype, aggregateid, epoch), t
WHERE d.aggregatetype = m.aggregatetype AND d.aggregateid = m.aggregateid AND d.epoch = m.epoch
