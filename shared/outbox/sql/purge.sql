-- Purge: delete up to $2 outbox rows committed before $1 that are
-- published, recorded by the ledger when $3, and wanted by no pending
-- re-push, in the order the outbox's BRIN index finds them (block ranges
-- in physical order, which is about the order of insertion). A deleted
-- row's cancel record (relaybus_outbox_cancelled) goes with it. Returns
-- how many outbox rows it deleted.
WITH gone AS (
DELETE FROM relaybus_outbox WHERE id IN (
    SELECT o.id
    FROM relaybus_outbox o
    JOIN relaybus_outbox_dispatch d ON d.aggregatetype = o.aggregatetype AND d.aggregateid = o.aggregateid
    WHERE o.created_at < $1
      AND o.version <= d.published_version
      AND (NOT $3 OR o.version <= d.ledger_version)
      AND NOT EXISTS (SELECT 1 FROM relaybus_outbox_repush q WHERE q.event_id = o.id AND q.failed_at IS NULL)
    LIMIT $2
)
RETURNING id
), cancels AS (
    DELETE FROM relaybus_outbox_cancelled c USING gone WHERE c.event_id = gone.id
)
SELECT count(*) FROM gone
