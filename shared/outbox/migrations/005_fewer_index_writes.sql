-- Fewer index writes per event (docs/decisions/inbox-writes-per-attempt.md).
--
-- The outbox is appended in created_at order, so its retention index is a
-- block-range index: a purge still finds the old rows, and an insert
-- writes no entry, at most a summary update (a B-tree took an entry per
-- event).
DROP INDEX IF EXISTS relaybus_outbox_created_at;
CREATE INDEX IF NOT EXISTS relaybus_outbox_created_at_brin
    ON relaybus_outbox USING brin (created_at) WITH (autosummarize = on);

-- Room on each page of the dispatch rows for a new version of a row, so an
-- update that changes no indexed column (a ledger cursor that moves with
-- nothing left to heal) is a heap-only tuple: no new index entries.
ALTER TABLE relaybus_outbox_dispatch SET (fillfactor = 70);
