SELECT d.aggregatetype, d.aggregateid, d.due_at AS was_due
    FROM relaybus_outbox_dispatch d, t
    WHERE d.due_at <= t.now
    ORDER BY d.due_at
    LIMIT $4
    FOR UPDATE OF d SKIP LOCKED
