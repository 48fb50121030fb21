-- Fewer index entries per dispatch step (docs/decisions/runs-not-rows.md,
-- "Writes per event").
--
-- A dispatch row's update that changes an indexed column writes a new
-- entry in the primary key and in every partial index whose predicate the
-- new row version meets; one that changes none is a heap-only tuple and
-- writes no index entry at all.
--
-- 1. A lease no longer moves due_at to its expiry (sql/claim.sql): a claim
--    takes an aggregate whose due_at has passed and whose lease, if any,
--    has expired, and the lease's update changes unindexed columns only.
--    Nothing to migrate: a row leased by an older relay has its due_at at
--    the lease's expiry, which the new claim also waits out.
--
-- 2. The retention index of idle aggregates leaves out those whose sends
--    the ledger has still to record (ledger_due_at set), which the purge
--    of dispatch rows skips anyway: a settle that moves the cursor with the
--    ledger on writes no entry in it, only the ledger's cursor move does.
CREATE INDEX IF NOT EXISTS relaybus_outbox_dispatch_idle_recorded
    ON relaybus_outbox_dispatch (published_at)
    WHERE due_at IS NULL AND failed_version IS NULL AND ledger_due_at IS NULL;
DROP INDEX IF EXISTS relaybus_outbox_dispatch_idle;

-- What an operator looks at (migration 003): a leased aggregate's next
-- attempt is when its lease expires, now that the lease leaves due_at.
CREATE OR REPLACE VIEW relaybus_outbox_backlog AS
SELECT d.aggregatetype,
       d.aggregateid,
       CASE WHEN d.failed_version IS NOT NULL THEN 'failed'
            WHEN d.lease_expires_at > now() THEN 'leased'
            WHEN d.due_at > now() THEN 'retrying'
            ELSE 'due' END AS state,
       u.unpublished,
       u.head_event_id,
       u.head_version,
       d.published_version,
       d.enqueued_version,
       d.failed_version,
       d.attempts,
       d.last_error,
       CASE WHEN d.due_at IS NOT NULL THEN greatest(d.due_at, d.lease_expires_at) END AS next_attempt_at,
       d.lease_owner,
       d.lease_expires_at,
       d.published_at AS last_published_at
FROM relaybus_outbox_dispatch d
CROSS JOIN LATERAL (
    SELECT count(*) AS unpublished,
           (array_agg(o.id ORDER BY o.version))[1] AS head_event_id,
           min(o.version) AS head_version
    FROM relaybus_outbox o
    WHERE o.aggregatetype = d.aggregatetype AND o.aggregateid = d.aggregateid
      AND o.version > d.published_version
) u
WHERE d.due_at IS NOT NULL OR d.failed_version IS NOT NULL OR d.enqueued_version > d.published_version;
