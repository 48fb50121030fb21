-- Purge dispatch rows: delete up to $2 aggregates idle since before $1
-- (nothing due, nothing FAILED, nothing for the ledger to record: the
-- relaybus_outbox_dispatch_idle_recorded index, migration 006) whose
-- rows are all gone. A producer that enqueues for one of them meanwhile
-- waits for the delete and then starts the aggregate afresh, which is
-- right: its cursor mattered only for rows that no longer exist.
DELETE FROM relaybus_outbox_dispatch WHERE (aggregatetype, aggregateid) IN (
    SELECT d.aggregatetype, d.aggregateid
    FROM relaybus_outbox_dispatch d
    WHERE d.due_at IS NULL AND d.failed_version IS NULL AND d.published_at < $1
      AND d.ledger_due_at IS NULL AND d.enqueued_version <= d.published_version
      AND NOT EXISTS (SELECT 1 FROM relaybus_outbox o
                      WHERE o.aggregatetype = d.aggregatetype AND o.aggregateid = d.aggregateid)
    ORDER BY d.published_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
