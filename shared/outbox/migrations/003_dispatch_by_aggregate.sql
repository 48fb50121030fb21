-- Dispatch by aggregate, not by row.
--
-- The relay's unit of work is an aggregate's run of unpublished versions.
-- Its dispatch state lives in one small row per aggregate, and the outbox
-- itself becomes append-only (so a change-data-capture reader such as
-- Debezium sees inserts only). A claim leases aggregates; a run is published as one
-- ordered bundle; one statement marks a whole batch by moving each
-- aggregate's published cursor.
--
--   published_version  every version of the aggregate up to this one is
--                      published (the cursor); the run is the rows above it
--   enqueued_version   the highest version enqueued (kept by Enqueue, in the
--                      producer's transaction); pending while it is above
--                      the cursor
--   due_at             when a relay may claim the aggregate next: the
--                      enqueue time for new work, the lease's expiry while
--                      leased, the retry time after a failed publish; NULL
--                      when there is nothing to do or it FAILED
--   epoch              bumped by every lease; a relay may move the cursor
--                      only under the epoch it leased (fencing)
--   attempts, last_error
--                      failed publishes of the first unpublished version
--   failed_version     set when that version failed MaxAttempts times: the
--                      aggregate is blocked until an operator re-pushes
--   ledger_version     every send up to this version is recorded in the
--                      ledger; ledger_due_at is when the relay's healing
--                      step may record the rest (the live recorder had
--                      its chance)
CREATE TABLE IF NOT EXISTS relaybus_outbox_dispatch (
    aggregatetype     text        NOT NULL,
    aggregateid       text        NOT NULL,
    enqueued_version  bigint      NOT NULL,
    published_version bigint      NOT NULL DEFAULT 0,
    published_at      timestamptz,
    due_at            timestamptz,
    epoch             bigint      NOT NULL DEFAULT 0,
    lease_owner       text,
    lease_expires_at  timestamptz,
    attempts          integer     NOT NULL DEFAULT 0,
    last_error        text,
    failed_version    bigint,
    failed_at         timestamptz,
    ledger_version    bigint      NOT NULL DEFAULT 0,
    ledger_due_at     timestamptz,
    PRIMARY KEY (aggregatetype, aggregateid)
);

-- Claims take due aggregates, oldest first.
CREATE INDEX IF NOT EXISTS relaybus_outbox_dispatch_due
    ON relaybus_outbox_dispatch (due_at) WHERE due_at IS NOT NULL;
-- FAILED aggregates, for the backlog's counts.
CREATE INDEX IF NOT EXISTS relaybus_outbox_dispatch_failed
    ON relaybus_outbox_dispatch (failed_at) WHERE failed_version IS NOT NULL;
-- Idle aggregates by the time they were last published, for retention.
CREATE INDEX IF NOT EXISTS relaybus_outbox_dispatch_idle
    ON relaybus_outbox_dispatch (published_at) WHERE due_at IS NULL AND failed_version IS NULL;
-- The ledger's healing step takes aggregates whose sends it must record.
CREATE INDEX IF NOT EXISTS relaybus_outbox_dispatch_ledger_due
    ON relaybus_outbox_dispatch (ledger_due_at) WHERE ledger_due_at IS NOT NULL;

-- Re-pushes of events that were already published: an operator's request
-- to publish one event again (to one consumer, or to all), whatever its
-- aggregate's cursor says. They do not hold up the aggregate's run; the
-- consumers' version gates keep order.
CREATE TABLE IF NOT EXISTS relaybus_outbox_repush (
    id               bigserial   PRIMARY KEY,
    event_id         text        NOT NULL,
    target_consumer  text,
    requested_at     timestamptz NOT NULL DEFAULT now(),
    due_at           timestamptz NOT NULL DEFAULT now(),
    attempts         integer     NOT NULL DEFAULT 0,
    last_error       text,
    failed_at        timestamptz
);
CREATE INDEX IF NOT EXISTS relaybus_outbox_repush_due
    ON relaybus_outbox_repush (due_at) WHERE failed_at IS NULL;
CREATE INDEX IF NOT EXISTS relaybus_outbox_repush_event
    ON relaybus_outbox_repush (event_id);

-- Retention walks the outbox by age.
CREATE INDEX IF NOT EXISTS relaybus_outbox_created_at ON relaybus_outbox (created_at);

-- Upgrade from per-row dispatch (migrations 001-002): derive each
-- aggregate's cursor from its rows, queue the re-pushes that were pending
-- on published rows, then drop the per-row state and its indexes. The
-- cursor stops below the lowest unpublished version, so a version that was
-- published out of order is published again (consumers' inboxes absorb it).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM information_schema.columns
               WHERE table_schema = current_schema() AND table_name = 'relaybus_outbox' AND column_name = 'published_at') THEN
        INSERT INTO relaybus_outbox_dispatch (aggregatetype, aggregateid, enqueued_version, published_version,
                                              published_at, due_at, attempts, last_error, failed_version, failed_at,
                                              ledger_version, ledger_due_at)
        SELECT aggregatetype, aggregateid, max(version),
               coalesce(min(version) FILTER (WHERE published_at IS NULL), max(version) + 1) - 1,
               max(published_at),
               CASE WHEN bool_or(published_at IS NULL) AND NOT bool_or(published_at IS NULL AND failed_at IS NOT NULL)
                    THEN now() END,
               coalesce(max(attempts) FILTER (WHERE published_at IS NULL), 0),
               max(last_error) FILTER (WHERE published_at IS NULL),
               min(version) FILTER (WHERE published_at IS NULL AND failed_at IS NOT NULL),
               max(failed_at) FILTER (WHERE published_at IS NULL),
               coalesce(min(version) FILTER (WHERE published_at IS NULL OR ledger_behind),
                        max(version) + 1) - 1,
               CASE WHEN bool_or(ledger_behind) THEN now() END
        FROM relaybus_outbox
        GROUP BY aggregatetype, aggregateid
        ON CONFLICT (aggregatetype, aggregateid) DO NOTHING;

        DROP INDEX IF EXISTS relaybus_outbox_pending_aggregate;
        DROP INDEX IF EXISTS relaybus_outbox_pending_seq;
        DROP INDEX IF EXISTS relaybus_outbox_leases;
        DROP INDEX IF EXISTS relaybus_outbox_published_at;
        DROP INDEX IF EXISTS relaybus_outbox_ledger_behind;
        ALTER TABLE relaybus_outbox
            DROP COLUMN IF EXISTS published_at,
            DROP COLUMN IF EXISTS attempts,
            DROP COLUMN IF EXISTS next_retry_at,
            DROP COLUMN IF EXISTS last_error,
            DROP COLUMN IF EXISTS failed_at,
            DROP COLUMN IF EXISTS lease_owner,
            DROP COLUMN IF EXISTS lease_expires_at,
            DROP COLUMN IF EXISTS ledger_behind;
    END IF;
END
$$;

-- What an operator looks at: every aggregate with something unpublished,
-- leased, retrying or FAILED, one row each (docs/producing.md, "The relay").
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
       d.due_at AS next_attempt_at,
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
