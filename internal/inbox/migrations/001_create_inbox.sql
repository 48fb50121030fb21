-- The consumer-side inbox: one row per (consumer, event) whose effect was
-- committed, written in the handler's own transaction. Several consumers may
-- share a database; each sees only its own rows.
CREATE TABLE IF NOT EXISTS relaybus_inbox (
    consumer_id  text        NOT NULL,
    event_id     text        NOT NULL,
    -- attempt_no is the attempt that applied the event: a redelivery after
    -- a lost ledger write records that same attempt again.
    attempt_no   integer     NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_id, event_id)
);

CREATE INDEX IF NOT EXISTS relaybus_inbox_processed_at ON relaybus_inbox (processed_at);

-- Attempt numbers per (consumer, event), committed before each attempt so
-- they keep counting across rolled-back attempts, redeliveries, re-pushes
-- and replays.
CREATE TABLE IF NOT EXISTS relaybus_inbox_attempts (
    consumer_id  text        NOT NULL,
    event_id     text        NOT NULL,
    attempts     integer     NOT NULL,
    last_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_id, event_id)
);

CREATE INDEX IF NOT EXISTS relaybus_inbox_attempts_last_at ON relaybus_inbox_attempts (last_at);
