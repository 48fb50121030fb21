-- Who detached an ordered push subscription's endpoint (its consumer's
-- pause on Pub/Sub): the forward consumer's circuit breaker, when its target
-- is down, or an operator (relaybus consumers pause). consume's probe
-- re-attaches only what its breaker detached, never an operator's pause; an
-- operator's resume lifts either. The endpoint and identity the breaker
-- detached are kept to be set back.

CREATE TABLE IF NOT EXISTS relaybus_inbox_push_pause (
    subscription    text        PRIMARY KEY,
    consumer_id     text        NOT NULL,
    paused_by       text        NOT NULL CHECK (paused_by IN ('breaker', 'operator')),
    who             text        NOT NULL DEFAULT '',
    endpoint        text        NOT NULL DEFAULT '',
    service_account text        NOT NULL DEFAULT '',
    audience        text        NOT NULL DEFAULT '',
    reason          text        NOT NULL DEFAULT '',
    paused_at       timestamptz NOT NULL DEFAULT now(),
    probe_after     timestamptz NOT NULL DEFAULT now(),
    failed_probes   integer     NOT NULL DEFAULT 0
);
