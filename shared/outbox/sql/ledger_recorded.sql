-- Recorded: the ledger holds the sends of each aggregate's versions from
-- from_version (exclusive) to to_version; its cursor moves there if it is
-- still at from_version (a recorder that lost a race changes nothing).
-- Caught up with the published cursor, the aggregate leaves the healing
-- step's queue; still behind, the healing step waits another $2 seconds,
-- since the live recorder is making progress.
--
-- $1 now (NULL: the database's clock); $2 heal delay in seconds; $3..$6 one
-- entry per aggregate: type, id, from_version, to_version.
WITH t AS (
    SELECT coalesce($1::timestamptz, now()) AS now
)
UPDATE relaybus_outbox_dispatch d SET
    ledger_version = m.to_version,
    ledger_due_at = CASE WHEN m.to_version >= d.published_version THEN NULL
                         ELSE t.now + make_interval(secs => $2) END
FROM unnest($3::text[], $4::text[], $5::bigint[], $6::bigint[]) AS m(aggregatetype, aggregateid, from_version, to_version), t
WHERE d.aggregatetype = m.aggregatetype AND d.aggregateid = m.aggregateid
  AND d.ledger_version = m.from_version
