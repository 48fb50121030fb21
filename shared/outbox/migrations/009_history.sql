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
-- by the relay before it moves rows (outbox.EnsureHistoryPartitions): rows
-- of topics with different retentions land in the partitions of their own
-- expiry, so expiry is a DROP of a whole partition once its month has passed
-- (outbox.PruneHistory), never a DELETE that leaves dead tuples.
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
