-- Lock an aggregate's strict position and return the last version applied,
-- creating the row for an aggregate that has none. Every transaction that
-- applies or parks an event of the aggregate, or releases its gap, takes
-- this row lock first, so they run one at a time per aggregate and each
-- sees what the one before it committed (a new aggregate's first two
-- events included).
--
-- An existing row is locked with FOR UPDATE, which writes a lock record to
-- the WAL but no new row version: the delivery's advance.sql writes the one
-- version it needs. A new aggregate's row is inserted at version 0, or at
-- version 1 with event id $5 when the event locking it is version 1 ($4):
-- that event is then applied without advance.sql, one row version instead
-- of two. Two transactions that create the same row meet on the primary
-- key: the second waits for the first to commit, then locks the committed
-- row through ON CONFLICT DO UPDATE (which writes a version; rare).
--
-- $1 consumer, $2 aggregate type, $3 aggregate id, $4 the version of the
-- event being handled (0: none, as for a gap's release), $5 its id.
-- Returns the position's version, whether this statement created it at $4
-- (the event is applied as far as the position goes), and, when it did,
-- whether version 2 is parked.
WITH locked AS (
    SELECT version
    FROM relaybus_strict_position
    WHERE consumer_id = $1 AND aggregate_type = $2 AND aggregate_id = $3
    FOR UPDATE
), created AS (
    INSERT INTO relaybus_strict_position AS p (consumer_id, aggregate_type, aggregate_id, version, event_id)
    SELECT $1, $2, $3, CASE WHEN $4::bigint = 1 THEN 1 ELSE 0 END, CASE WHEN $4::bigint = 1 THEN $5::text ELSE '' END
    WHERE NOT EXISTS (SELECT 1 FROM locked)
    ON CONFLICT (consumer_id, aggregate_type, aggregate_id) DO UPDATE SET version = p.version
    RETURNING version, xmax = 0 AND version = 1 AS at_event
)
SELECT version, false, false FROM locked
UNION ALL
SELECT version, at_event,
       at_event AND EXISTS (SELECT 1 FROM relaybus_strict_parked
                            WHERE consumer_id = $1 AND aggregate_type = $2 AND aggregate_id = $3 AND version = 2)
FROM created
