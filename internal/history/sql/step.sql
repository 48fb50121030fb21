-- One step of a running backfill, in one statement: the next $2 events of
-- its scope (scope.sql, after its cursor) are queued as re-pushes
-- addressed to its consumer, in order, and the cursor moves past them. A
-- step that finds fewer than $2 ends the backfill (done). A backfill that
-- is not running changes nothing (no row returned).
--
-- $1 backfill id, $2 batch size.
WITH job AS (
    SELECT * FROM relaybus_outbox_backfill WHERE id = $1 AND state = 'running' FOR UPDATE
), picked AS (
    SELECT s.* FROM job, LATERAL (%s) s
), queued AS (
    INSERT INTO relaybus_outbox_repush (event_id, target_consumer)
    SELECT p.id, job.consumer FROM picked p, job
    ORDER BY p.aggregatetype, p.aggregateid, p.version
    RETURNING 1
), last AS (
    SELECT p.aggregatetype, p.aggregateid, p.version FROM picked p
    ORDER BY p.aggregatetype DESC, p.aggregateid DESC, p.version DESC LIMIT 1
), n AS (
    SELECT count(*) AS n FROM queued
)
UPDATE relaybus_outbox_backfill b SET
    queued         = b.queued + n.n,
    cursor_type    = coalesce((SELECT aggregatetype FROM last), b.cursor_type),
    cursor_id      = coalesce((SELECT aggregateid FROM last), b.cursor_id),
    cursor_version = coalesce((SELECT version FROM last), b.cursor_version),
    started_at     = coalesce(b.started_at, now()),
    updated_at     = now(),
    state          = CASE WHEN n.n < $2 THEN 'done' ELSE b.state END,
    finished_at    = CASE WHEN n.n < $2 THEN now() END
FROM job, n
WHERE b.id = job.id
RETURNING %s
