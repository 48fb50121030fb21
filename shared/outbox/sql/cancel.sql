-- Cancel: record the cancel of the head version $4 of aggregate ($2, $3)
-- and move the aggregate's cursor past it without publishing it. The lease
-- is ended and the epoch bumped, so a relay that holds the aggregate
-- (with nothing to publish: its head was not due) settles nothing. The
-- ledger's cursor follows when it had recorded everything before; behind,
-- its healing step skips the cancelled row. The aggregate is due again
-- when it has more: at once, or at its next version's deliver_at.
--
-- $1 event id, $2 aggregate type, $3 aggregate id, $4 version, $5
-- deliver_at, $6 who, $7 reason.
WITH c AS (
    INSERT INTO relaybus_outbox_cancelled (event_id, aggregatetype, aggregateid, version, deliver_at, cancelled_by, reason)
    VALUES ($1, $2, $3, $4, $5, $6, $7)
    RETURNING cancelled_at
)
UPDATE relaybus_outbox_dispatch d SET
    published_version = $4,
    ledger_version    = CASE WHEN d.ledger_version >= d.published_version THEN $4 ELSE d.ledger_version END,
    epoch             = d.epoch + 1,
    lease_owner       = NULL,
    lease_expires_at  = NULL,
    attempts          = 0,
    last_error        = NULL,
    due_at            = CASE WHEN d.enqueued_version > $4 THEN greatest(now(), coalesce(
                            (SELECT o.deliver_at FROM relaybus_outbox o
                              WHERE o.aggregatetype = d.aggregatetype AND o.aggregateid = d.aggregateid
                                AND o.version > $4
                              ORDER BY o.version LIMIT 1), now())) END
FROM c
WHERE d.aggregatetype = $2 AND d.aggregateid = $3
RETURNING c.cancelled_at
