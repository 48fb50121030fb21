-- The generic projection: each aggregate's latest state as the consumer
-- saw it, taken only from events newer than what it holds.
CREATE TABLE IF NOT EXISTS relaybus_projection (
    consumer_id    text        NOT NULL,
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    version        bigint      NOT NULL,
    event_id       text        NOT NULL,
    event_type     text        NOT NULL,
    state          jsonb       NOT NULL,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_id, aggregate_type, aggregate_id)
);

-- Strict handlers' position per aggregate: the last version applied.
CREATE TABLE IF NOT EXISTS relaybus_strict_position (
    consumer_id    text        NOT NULL,
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    version        bigint      NOT NULL,
    event_id       text        NOT NULL,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_id, aggregate_type, aggregate_id)
);
