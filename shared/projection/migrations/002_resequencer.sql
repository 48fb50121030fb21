-- A strict handler's resequencer: events that arrived before their
-- predecessor, held until it is applied. The event is kept as its JSON
-- envelope (json keeps the bytes as written, so the payload is applied
-- exactly as it arrived) with the facts of the delivery that brought it.
-- stalled_for is the missing version a stalled attempt was recorded for
-- (NULL until the gap outlives the gap timeout), so each gap is reported
-- once.
CREATE TABLE IF NOT EXISTS relaybus_strict_parked (
    consumer_id      text        NOT NULL,
    aggregate_type   text        NOT NULL,
    aggregate_id     text        NOT NULL,
    version          bigint      NOT NULL,
    event_id         text        NOT NULL,
    event            json        NOT NULL,
    topic            text        NOT NULL DEFAULT '',
    subscription     text        NOT NULL DEFAULT '',
    message_id       text        NOT NULL DEFAULT '',
    delivery_attempt integer     NOT NULL DEFAULT 0,
    parked_at        timestamptz NOT NULL,
    stalled_for      bigint,
    PRIMARY KEY (consumer_id, aggregate_type, aggregate_id, version)
);

-- The gap list and the scheduled check, oldest first.
CREATE INDEX IF NOT EXISTS relaybus_strict_parked_parked_at ON relaybus_strict_parked (consumer_id, parked_at);

-- Versions an operator released a gap with (POST /gaps:skip): never
-- applied; a late delivery of one is acknowledged as a permanent failure
-- (version_skipped).
CREATE TABLE IF NOT EXISTS relaybus_strict_skipped (
    consumer_id    text        NOT NULL,
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    version        bigint      NOT NULL,
    skipped_at     timestamptz NOT NULL DEFAULT now(),
    skipped_by     text        NOT NULL DEFAULT '',
    reason         text        NOT NULL DEFAULT '',
    PRIMARY KEY (consumer_id, aggregate_type, aggregate_id, version)
);
