-- A consumer's own delivery control, for the consumer kinds and brokers that
-- have no pause of their own (pull workers, Eventarc triggers, NATS
-- JetStream): an operator's pause is a row here, which consume reads. While
-- it stands, a pull worker stops pulling and holds what it has under its
-- lease, and an HTTP delivery is kept in relaybus_inbox_held and
-- acknowledged, so no delivery attempt is spent. Resuming deletes the row
-- and publishes the kept messages again, addressed to the consumer alone.

CREATE TABLE IF NOT EXISTS relaybus_inbox_pause (
    consumer_id text        NOT NULL,
    topic       text        NOT NULL,
    paused_at   timestamptz NOT NULL DEFAULT now(),
    paused_by   text        NOT NULL DEFAULT '',
    PRIMARY KEY (consumer_id, topic)
);

CREATE TABLE IF NOT EXISTS relaybus_inbox_held (
    consumer_id text        NOT NULL,
    topic       text        NOT NULL,
    seq         bigint      GENERATED ALWAYS AS IDENTITY,
    message     jsonb       NOT NULL,
    held_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_id, topic, seq)
);
