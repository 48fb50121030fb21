-- Every consumption attempt, committed in Postgres: a successful attempt in
-- the handler's own transaction (with the inbox row and the effect), a
-- failed one right after the rollback. Postgres is the truth of what was
-- consumed; the ledger (Firestore) is written after the fact, and shipped_at
-- says which attempts it has. A scheduled step ships those it is missing
-- (the consume function's POST /ledger:ship).
CREATE TABLE IF NOT EXISTS relaybus_attempts (
    consumer_id      text        NOT NULL,
    event_id         text        NOT NULL,
    attempt_no       integer     NOT NULL,
    outcome          text        NOT NULL,
    error_code       text        NOT NULL DEFAULT '',
    error_message    text        NOT NULL DEFAULT '',
    consumed_at      timestamptz NOT NULL,
    topic            text        NOT NULL DEFAULT '',
    subscription     text        NOT NULL DEFAULT '',
    message_id       text        NOT NULL DEFAULT '',
    delivery_attempt integer     NOT NULL DEFAULT 0,
    seq              bigserial   NOT NULL,
    shipped_at       timestamptz,
    PRIMARY KEY (consumer_id, event_id, attempt_no)
);

-- Attempts the ledger does not have yet, oldest first.
CREATE INDEX IF NOT EXISTS relaybus_attempts_unshipped
    ON relaybus_attempts (seq) WHERE shipped_at IS NULL;
-- Retention.
CREATE INDEX IF NOT EXISTS relaybus_attempts_consumed_at ON relaybus_attempts (consumed_at);
