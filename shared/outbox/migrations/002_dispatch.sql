-- What the relay needs to find work fast and to heal the ledger.
--
-- Pending rows by aggregate and version: finding an aggregate's head (its
-- lowest unpublished version) and the run behind it is an index range scan.
CREATE INDEX IF NOT EXISTS relaybus_outbox_pending_aggregate
    ON relaybus_outbox (aggregatetype, aggregateid, version)
    WHERE published_at IS NULL;

-- Claimable rows in enqueue order: claims take the oldest heads first.
-- Leased rows leave this index, so a claim never wades through another
-- relay's work; an expired lease is cleared (relaybus_outbox_leases) and
-- its row comes back.
CREATE INDEX IF NOT EXISTS relaybus_outbox_pending_seq
    ON relaybus_outbox (seq)
    WHERE published_at IS NULL AND failed_at IS NULL AND lease_owner IS NULL;

-- Leased rows by expiry, to take over a dead relay's rows.
CREATE INDEX IF NOT EXISTS relaybus_outbox_leases
    ON relaybus_outbox (lease_expires_at)
    WHERE lease_owner IS NOT NULL;

-- Published rows by age, for retention.
CREATE INDEX IF NOT EXISTS relaybus_outbox_published_at
    ON relaybus_outbox (published_at)
    WHERE published_at IS NOT NULL;

-- ledger_behind is true while the ledger has not recorded the row's send
-- (RecordSent failed); a later relay run records it again.
ALTER TABLE relaybus_outbox ADD COLUMN IF NOT EXISTS ledger_behind boolean NOT NULL DEFAULT false;
CREATE INDEX IF NOT EXISTS relaybus_outbox_ledger_behind
    ON relaybus_outbox (seq)
    WHERE ledger_behind;
