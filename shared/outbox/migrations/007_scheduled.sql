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

-- What an operator looks at (migrations 003, 006): an aggregate whose
-- first unpublished version is scheduled is "scheduled" until then, not
-- "retrying" (it has no failed attempt).
CREATE OR REPLACE VIEW relaybus_outbox_backlog AS
SELECT d.aggregatetype,
       d.aggregateid,
       CASE WHEN d.failed_version IS NOT NULL THEN 'failed'
            WHEN d.lease_expires_at > now() THEN 'leased'
            WHEN d.due_at > now() AND d.attempts = 0 THEN 'scheduled'
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
