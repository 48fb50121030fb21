-- Re-push find: the event's aggregate and version, its aggregate's
-- published cursor and FAILED version, and whether a re-push of it is
-- still on its way; the row is locked so concurrent re-pushes of one
-- event take turns. No row: retention deleted the event.
--
-- $1 event id.
SELECT o.aggregatetype, o.aggregateid, o.version, d.published_version, d.failed_version,
        EXISTS (SELECT 1 FROM relaybus_outbox_repush q WHERE q.event_id = o.id AND q.failed_at IS NULL)
    FROM relaybus_outbox o
    LEFT JOIN relaybus_outbox_dispatch d ON d.aggregatetype = o.aggregatetype AND d.aggregateid = o.aggregateid
    WHERE o.id = $1
    FOR UPDATE OF o
