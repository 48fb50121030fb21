-- Scheduled events (docs/producing.md, "Scheduled events").
--
-- deliver_at, when set, is the earliest time the relay may publish the
-- row. A scheduled version holds its aggregate's later versions: the relay
-- publishes a run up to the first version not yet due and sets the
-- dispatch row's due_at to that version's deliver_at. The column is NULL
-- for an unscheduled event, so such a row is written as before (its null
-- bitmap already has room for the column).
ALTER TABLE relaybus_outbox ADD COLUMN IF NOT EXISTS deliver_at timestamptz;

-- Scheduled rows by time, for the operators' listing. Partial: an
-- unscheduled row writes no entry.
CREATE INDEX IF NOT EXISTS relaybus_outbox_scheduled
    ON relaybus_outbox (deliver_at) WHERE deliver_at IS NOT NULL;

-- Scheduled events cancelled before they were due. The outbox stays
-- append-only: a cancel is a row here, and its aggregate's cursor moves
-- past the cancelled version without publishing it.
CREATE TABLE IF NOT EXISTS relaybus_outbox_cancelled (
    event_id       text        PRIMARY KEY,
    aggregatetype  text        NOT NULL,
    aggregateid    text        NOT NULL,
    version        bigint      NOT NULL,
    deliver_at     timestamptz NOT NULL,
    cancelled_at   timestamptz NOT NULL DEFAULT now(),
    cancelled_by   text        NOT NULL DEFAULT '',
    reason         text        NOT NULL DEFAULT ''
);
