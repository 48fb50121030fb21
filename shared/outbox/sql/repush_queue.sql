-- Re-push queue: a published event is queued to be published again,
-- outside its aggregate's run (see repush_claim.sql).
--
-- $1 event id, $2 target consumer ('' or NULL: every consumer).
INSERT INTO relaybus_outbox_repush (event_id, target_consumer) VALUES ($1, nullif($2, ''))
