-- Claim: lease up to $4 aggregates (the CTE "due", which the drain and the
-- fast path each define) and return each one's run: its rows above the
-- published cursor in version order, at most $5 per aggregate and $6 in
-- all. A lease bumps the epoch (the fence a relay must hold to move the
-- cursor) and makes the aggregate due again when it expires, so a relay
-- that dies leaves nothing stuck. The rows are shared out round-robin
-- (every run's first row, then every second row, ...), so each aggregate
-- gets its share and each run is a prefix of its rows. An aggregate that
-- gets no row (the cap ran out, or its rows are gone) comes back with its
-- lease and no row, to be released.
--
-- $1 now (NULL: the database's clock), $2 owner, $3 lease in seconds,
-- $4 aggregates, $5 rows per aggregate, $6 rows in all (and $7, the fast
-- path's event ids).
WITH t AS (
    SELECT coalesce($1::timestamptz, now()) AS now
), due AS (
    %s
), leased AS (
    UPDATE relaybus_outbox_dispatch d
    SET lease_owner = $2, epoch = d.epoch + 1,
        lease_expires_at = t.now + make_interval(secs => $3),
        due_at = t.now + make_interval(secs => $3)
    FROM due, t
    WHERE d.aggregatetype = due.aggregatetype AND d.aggregateid = due.aggregateid
    RETURNING d.aggregatetype, d.aggregateid, d.epoch, d.published_version, d.attempts, due.was_due
), runs AS (
    SELECT l.aggregatetype, l.aggregateid, l.was_due, r.*,
           row_number() OVER (ORDER BY r.k, l.was_due, l.aggregatetype, l.aggregateid) AS n
    FROM leased l
    CROSS JOIN LATERAL (
        SELECT o.id, o.event_type, o.version, o.payload, o.occurred_at, o.topic, o.source,
               o.schema_version, o.payload_type, o.trace_id, o.span_id, o.parent_event_id,
               o.correlation_id, o.initiator, o.expire_at, o.target_consumer, o.created_at,
               row_number() OVER (ORDER BY o.version) AS k
        FROM relaybus_outbox o
        WHERE o.aggregatetype = l.aggregatetype AND o.aggregateid = l.aggregateid
          AND o.version > l.published_version
        ORDER BY o.version
        LIMIT $5
    ) r
)
SELECT l.aggregatetype, l.aggregateid, l.epoch, l.published_version, l.attempts,
       r.id, r.event_type, r.version, r.payload, r.occurred_at, r.topic, r.source, r.schema_version,
       r.payload_type, r.trace_id, r.span_id, r.parent_event_id, r.correlation_id, r.initiator,
       r.expire_at, r.target_consumer, r.created_at
FROM leased l
LEFT JOIN runs r
       ON r.aggregatetype = l.aggregatetype AND r.aggregateid = l.aggregateid AND r.n <= $6
ORDER BY l.was_due, l.aggregatetype, l.aggregateid, r.version
