-- Forward consumers added at run time (internal/forwarders): an operator adds,
-- changes and removes them through the operators' API (functions/dlqreplay's
-- /forwarders), and one consume service deployed with
-- CONSUMER_HANDLER=forwarders serves them all, each under its own name, with
-- the inbox, attempts and dead letters of a deployed consumer. A row is the
-- forwarder's whole configuration; revision grows at each change, so a consume
-- instance knows its cached copy is stale. Named relaybus_inbox_* so that the
-- database roles (internal/pgroles) of dlqreplay (which writes it) and consume
-- (which reads it) are granted it with the inbox's other tables.

CREATE TABLE IF NOT EXISTS relaybus_inbox_forwarders (
    name            text             PRIMARY KEY,
    topic           text             NOT NULL,
    url             text             NOT NULL,
    auth            text             NOT NULL DEFAULT 'none',
    audience        text             NOT NULL DEFAULT '',
    filter          text             NOT NULL DEFAULT '',
    max_in_flight   integer          NOT NULL DEFAULT 0,
    max_per_second  double precision NOT NULL DEFAULT 0,
    timeout_seconds integer          NOT NULL DEFAULT 0,
    description     text             NOT NULL DEFAULT '',
    revision        bigint           NOT NULL DEFAULT 1,
    created_at      timestamptz      NOT NULL DEFAULT now(),
    created_by      text             NOT NULL DEFAULT '',
    updated_at      timestamptz      NOT NULL DEFAULT now(),
    updated_by      text             NOT NULL DEFAULT ''
);
