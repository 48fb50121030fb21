-- Each consume instance's flow control as the instance reports it: when a
-- delivery last had to wait for the consumer's max_in_flight or
-- max_per_second (or was refused), and how many it has refused. An
-- instance writes its row only after it was at a limit, at most once per
-- report interval, so a consumer below its limits writes nothing here. The
-- operators' API reads it to show whether a consumer is at its limits;
-- rows of instances that stopped reporting a day ago are deleted by the
-- next report.

CREATE TABLE IF NOT EXISTS relaybus_inbox_flow (
    consumer_id text        NOT NULL,
    instance    text        NOT NULL,
    at_limit_at timestamptz NOT NULL,
    refused     bigint      NOT NULL DEFAULT 0,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_id, instance)
);
