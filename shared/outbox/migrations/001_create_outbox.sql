-- The transactional outbox. The first seven columns are the company-wide
-- minimum (id, aggregatetype, aggregateid, event type, version, payload,
-- occurred_at), named so that a Debezium outbox event router can read the
-- table; the rest is the rest of the event's envelope and the relay's
-- dispatch state.
CREATE TABLE IF NOT EXISTS relaybus_outbox (
    id               text        PRIMARY KEY,
    aggregatetype    text        NOT NULL,
    aggregateid      text        NOT NULL,
    event_type       text        NOT NULL,
    version          bigint      NOT NULL CHECK (version >= 1),
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

    -- Dispatch state, written by the relay.
    seq              bigserial   NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    target_consumer  text,
    published_at     timestamptz,
    attempts         integer     NOT NULL DEFAULT 0,
    next_retry_at    timestamptz,
    last_error       text,
    failed_at        timestamptz,
    lease_owner      text,
    lease_expires_at timestamptz
);

-- One event per aggregate version: a second event claiming a version the
-- aggregate already has is a conflict, not a duplicate.
CREATE UNIQUE INDEX IF NOT EXISTS relaybus_outbox_aggregate_version
    ON relaybus_outbox (aggregatetype, aggregateid, version);
