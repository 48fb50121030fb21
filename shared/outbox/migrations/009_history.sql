-- Event history (docs/history.md; docs/decisions/history-in-the-outbox-database.md).
--
-- Retention does not delete a published row: it moves it here (sql/purge.sql),
-- where it stays until keep_until, its topic's history retention after the
-- move (topology: history_retention_days). A topic whose retention is 0
-- keeps no history: its rows are deleted as before. The outbox and this
-- table together hold every published event of the database's topics for
-- as long as their retention says, which is what a backfill reads.
--
-- The event's columns are the outbox's (the dispatch state is left behind);
-- a migration that adds an event column to relaybus_outbox adds it here too.
--
-- Partitioned by keep_until, one partition per calendar month (UTC), created
-- before rows are moved (outbox.EnsureHistoryPartitions): rows of topics
-- with different retentions land in the partitions of their own expiry, so
-- expiry is a DROP of a whole partition once its month has passed
-- (outbox.PruneHistory), never a DELETE that leaves dead tuples. Both go
-- through relaybus_outbox_history_partitions below, which runs as the
-- table's owner: the relay's role has no DDL (internal/pgroles), and reads
-- and writes the partitions through the parent, where its grants are.
CREATE TABLE IF NOT EXISTS relaybus_outbox_history (
    id               text        NOT NULL,
    aggregatetype    text        NOT NULL,
    aggregateid      text        NOT NULL,
    event_type       text        NOT NULL,
    version          bigint      NOT NULL,
    payload          bytea       NOT NULL,
    occurred_at      timestamptz NOT NULL,
    topic            text        NOT NULL,
    source           text        NOT NULL,
    schema_version   text        NOT NULL,
    payload_type     text        NOT NULL,
    trace_id         text        NOT NULL DEFAULT '',
    span_id          text        NOT NULL DEFAULT '',
    parent_event_id  text        NOT NULL DEFAULT '',
    correlation_id   text        NOT NULL DEFAULT '',
    initiator        jsonb       NOT NULL DEFAULT '{}'::jsonb,
    expire_at        timestamptz,
    target_consumer  text,
    created_at       timestamptz NOT NULL,
    traceparent      text,
    source_version   text,
    archived_at      timestamptz NOT NULL DEFAULT now(),
    keep_until       timestamptz NOT NULL
) PARTITION BY RANGE (keep_until);

-- Creates the monthly partitions from the month of $1 to the month of $2
-- (those missing) and drops those whose month ended at or before $3;
-- returns the names it dropped. SECURITY DEFINER with the migration's
-- search_path: it acts on this schema's history only, as its owner.
CREATE OR REPLACE FUNCTION relaybus_outbox_history_partitions(first_month timestamptz, last_month timestamptz, drop_before timestamptz)
RETURNS SETOF text
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT
AS $$
DECLARE
    m timestamptz := date_trunc('month', first_month AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';
    part text;
    month_start timestamptz;
BEGIN
    WHILE m <= last_month LOOP
        part := 'relaybus_outbox_history_y' || to_char(m AT TIME ZONE 'UTC', 'YYYY"m"MM');
        IF to_regclass(part) IS NULL THEN
            -- Relays run at once: one that loses the race to create the
            -- partition finds it made.
            BEGIN
                EXECUTE format('CREATE TABLE %I PARTITION OF relaybus_outbox_history FOR VALUES FROM (%L) TO (%L)',
                    part, m, m + interval '1 month');
            EXCEPTION WHEN duplicate_table OR unique_violation THEN
                NULL;
            END;
        END IF;
        m := (m AT TIME ZONE 'UTC' + interval '1 month') AT TIME ZONE 'UTC';
    END LOOP;
    FOR part IN
        SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'relaybus_outbox_history'::regclass AND c.relname ~ '^relaybus_outbox_history_y[0-9]{4}m[0-9]{2}$'
        ORDER BY c.relname
    LOOP
        month_start := make_timestamptz(substr(part, 26, 4)::int, substr(part, 31, 2)::int, 1, 0, 0, 0, 'UTC');
        IF month_start + interval '1 month' <= drop_before THEN
            BEGIN
                EXECUTE format('DROP TABLE %I', part);
                RETURN NEXT part;
            EXCEPTION WHEN undefined_table THEN
                NULL; -- another relay dropped it
            END;
        END IF;
    END LOOP;
END
$$;

-- A backfill walks a topic's aggregates in order, version by version.
CREATE INDEX IF NOT EXISTS relaybus_outbox_history_walk
    ON relaybus_outbox_history (topic, aggregatetype, aggregateid, version);
-- The relay's re-push claim finds a history row by its id.
CREATE INDEX IF NOT EXISTS relaybus_outbox_history_id
    ON relaybus_outbox_history (id);

-- Backfills: one consumer fed a topic's history (docs/history.md). The job
-- and its cursor live beside the events it reads: one statement queues the
-- next batch as re-pushes addressed to the consumer and moves the cursor
-- past them, so a backfill paused, resumed, or cut short by a crash queues
-- every event of its scope once.
CREATE TABLE IF NOT EXISTS relaybus_outbox_backfill (
    id              text        PRIMARY KEY,
    topic           text        NOT NULL,
    consumer        text        NOT NULL,
    since           timestamptz NOT NULL,
    until           timestamptz NOT NULL,
    aggregates      text[]      NOT NULL DEFAULT '{}',
    rate            double precision NOT NULL,
    state           text        NOT NULL DEFAULT 'running',
    matched         bigint      NOT NULL DEFAULT 0,
    queued          bigint      NOT NULL DEFAULT 0,
    -- The cursor: the last (aggregate type, aggregate id, version) queued.
    cursor_type     text        NOT NULL DEFAULT '',
    cursor_id       text        NOT NULL DEFAULT '',
    cursor_version  bigint      NOT NULL DEFAULT 0,
    created_by      text        NOT NULL DEFAULT '',
    created_at      timestamptz NOT NULL DEFAULT now(),
    started_at      timestamptz,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    CHECK (state IN ('running', 'paused', 'cancelled', 'done'))
);

-- Re-pushes are claimed in the order they were queued (sql/repush_claim.sql
-- orders by due_at, then id): a backfill queues an aggregate's versions in
-- order, in one statement (one due_at), and they go out in that order.
CREATE INDEX IF NOT EXISTS relaybus_outbox_repush_due_order
    ON relaybus_outbox_repush (due_at, id) WHERE failed_at IS NULL;
DROP INDEX IF EXISTS relaybus_outbox_repush_due;
