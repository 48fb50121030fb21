-- Claim: lease due aggregates (the CTE "due", which the drain and the fast
-- path each define) and return each one's run: its rows above the
-- published cursor in version order. A claim takes at most $5 rows of one
-- aggregate and about $6 rows in all: "due" leases aggregates, oldest due
-- first, only while their expected runs (at most $5 each) fit in $6, so a
-- deep backlog is shared out between concurrent claims a few aggregates
-- each, and a shallow one goes many aggregates at a time (at most $4). A
-- lease bumps the epoch (the fence a relay must hold to move the cursor)
-- and holds the aggregate until it expires: a due aggregate is one whose
-- due_at has passed and whose lease, if any, has expired, so a relay that
-- dies leaves nothing stuck. The lease leaves due_at as it is: the update
-- changes no indexed column, so it is a heap-only tuple (no new entry in
-- the primary key or the due index). An aggregate whose rows are gone
-- comes back with its lease and no row, to be released. Cancelled rows
-- are left out. Each row says
-- whether it is held (scheduled after now): the run ends before the first
-- held row (Claim cuts it there), and the settle makes the aggregate due
-- at that row's deliver_at.
--
-- $1 now (NULL: the database's clock), $2 owner, $3 lease in seconds,
-- $4 aggregates at most, $5 rows per aggregate, $6 rows in all (and $7,
-- the fast path's event ids).
WITH t AS (
    SELECT coalesce($1::timestamptz, now()) AS now
), due AS (
    %s
), leased AS (
    -- The rows "due" locked, found by their tuple ids (a lock does not
    -- move a row, and no one else can while it holds), not joined on the
    -- key: the planner cannot tell how few "due" returns and would hash
    -- the whole table. due_at is as "due" read it: the lease leaves it.
    UPDATE relaybus_outbox_dispatch d
    SET lease_owner = $2, epoch = d.epoch + 1,
        lease_expires_at = t.now + make_interval(secs => $3)
    FROM t
    WHERE d.ctid = ANY(ARRAY(SELECT due.ctid FROM due))
    RETURNING d.aggregatetype, d.aggregateid, d.epoch, d.published_version, d.attempts, d.due_at AS was_due
)
SELECT l.aggregatetype, l.aggregateid, l.epoch, l.published_version, l.attempts,
       r.id, r.event_type, r.version, r.payload, r.occurred_at, r.topic, r.source, r.schema_version,
       r.payload_type, r.trace_id, r.span_id, r.parent_event_id, r.correlation_id, r.initiator,
       r.expire_at, r.target_consumer, r.created_at, r.traceparent, r.source_version, r.deliver_at,
       r.deliver_at > (SELECT t.now FROM t) AS held
FROM leased l
LEFT JOIN LATERAL (
    SELECT o.id, o.event_type, o.version, o.payload, o.occurred_at, o.topic, o.source,
           o.schema_version, o.payload_type, o.trace_id, o.span_id, o.parent_event_id,
           o.correlation_id, o.initiator, o.expire_at, o.target_consumer, o.created_at, o.traceparent,
           o.deliver_at, o.source_version
    FROM relaybus_outbox o
    WHERE o.aggregatetype = l.aggregatetype AND o.aggregateid = l.aggregateid
      AND o.version > l.published_version
      -- A cancelled version is never published, also when a late version
      -- below it sent the cursor back.
      AND NOT EXISTS (SELECT 1 FROM relaybus_outbox_cancelled c WHERE c.event_id = o.id)
    ORDER BY o.version
    LIMIT $5
) r ON true
ORDER BY l.was_due, l.aggregatetype, l.aggregateid, r.version
