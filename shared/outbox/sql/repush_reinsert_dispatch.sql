-- Re-push reinsert dispatch: the dispatch row of a reinserted event's
-- aggregate, when retention deleted it too, with every cursor at the
-- event's version (it counts as published).
--
-- $1 aggregate type, $2 aggregate id, $3 version.
INSERT INTO relaybus_outbox_dispatch (aggregatetype, aggregateid, enqueued_version, published_version, ledger_version, published_at)
VALUES ($1, $2, $3, $3, $3, now())
ON CONFLICT (aggregatetype, aggregateid) DO NOTHING
