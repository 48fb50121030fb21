SELECT d.ctid
    FROM relaybus_outbox_dispatch d, t
    WHERE d.due_at <= t.now AND (d.lease_expires_at IS NULL OR d.lease_expires_at <= t.now)
    ORDER BY d.due_at
    -- As many of the oldest due aggregates as their runs fit in $6 (at
    -- least one), estimated without locking, then that many taken with
    -- SKIP LOCKED: concurrent claims take the next ones.
    LIMIT (SELECT greatest(count(*), 1) FROM (
              SELECT sum(least(c.enqueued_version - c.published_version, $5)) OVER (ORDER BY c.due_at ROWS UNBOUNDED PRECEDING)
                     - least(c.enqueued_version - c.published_version, $5) AS before
              FROM relaybus_outbox_dispatch c, t
              WHERE c.due_at <= t.now AND (c.lease_expires_at IS NULL OR c.lease_expires_at <= t.now)
              ORDER BY c.due_at
              LIMIT $4) fit
           WHERE fit.before < $6)
    FOR UPDATE OF d SKIP LOCKED
