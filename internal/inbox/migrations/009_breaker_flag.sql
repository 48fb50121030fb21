-- A forward consumer's circuit breaker pauses, by the consumer's own flag
-- (migration 005), the consumers whose delivery it cannot detach: Eventarc
-- triggers. The flag's row then says it is the breaker's (breaker), what
-- the breaker's last call or probe found (reason), when its next probe may go
-- (probe_after, its cool-down) and how many probes found the target still
-- down. consume's probe lifts only a breaker's row; an operator's pause takes
-- a breaker's row over (breaker false), and an operator's resume lifts either.

ALTER TABLE relaybus_inbox_pause
    ADD COLUMN IF NOT EXISTS breaker       boolean     NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS reason        text        NOT NULL DEFAULT '',
    ADD COLUMN IF NOT EXISTS probe_after   timestamptz NOT NULL DEFAULT now(),
    ADD COLUMN IF NOT EXISTS failed_probes integer     NOT NULL DEFAULT 0;
