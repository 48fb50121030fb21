SELECT d.ctid
    FROM relaybus_outbox_dispatch d, t
    WHERE (d.aggregatetype, d.aggregateid) IN (
            SELECT o.aggregatetype, o.aggregateid FROM relaybus_outbox o WHERE o.id = ANY($7::text[]))
      AND d.due_at <= t.now AND (d.lease_expires_at IS NULL OR d.lease_expires_at <= t.now)
    ORDER BY d.due_at
    LIMIT least($4::integer, $6::integer)
    FOR UPDATE OF d SKIP LOCKED
