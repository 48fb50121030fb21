-- Count: the backlog. Unpublished rows of aggregates that are not FAILED
-- (due, leased or retrying), the FAILED versions and the rows blocked
-- behind them, and the re-pushes waiting or FAILED. Pending aggregates
-- always have a due_at (or are FAILED), so both sets come from indexes.
WITH pending AS (
    SELECT d.aggregatetype, d.aggregateid, d.published_version, d.failed_version, d.lease_expires_at
    FROM relaybus_outbox_dispatch d WHERE d.due_at IS NOT NULL
    UNION
    SELECT d.aggregatetype, d.aggregateid, d.published_version, d.failed_version, d.lease_expires_at
    FROM relaybus_outbox_dispatch d WHERE d.failed_version IS NOT NULL
), rows AS (
    SELECT p.*, (SELECT count(*) FROM relaybus_outbox o
                  WHERE o.aggregatetype = p.aggregatetype AND o.aggregateid = p.aggregateid
                    AND o.version > p.published_version) AS n
    FROM pending p
)
SELECT coalesce(sum(n) FILTER (WHERE failed_version IS NULL), 0),
       count(*) FILTER (WHERE failed_version IS NOT NULL),
       coalesce(sum(n - 1) FILTER (WHERE failed_version IS NOT NULL), 0),
       count(*) FILTER (WHERE failed_version IS NULL AND n > 0),
       count(*) FILTER (WHERE lease_expires_at > now()),
       (SELECT count(*) FROM relaybus_outbox_repush WHERE failed_at IS NULL),
       (SELECT count(*) FROM relaybus_outbox_repush WHERE failed_at IS NOT NULL)
FROM rows
