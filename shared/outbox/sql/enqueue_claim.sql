-- EnqueueClaim: Enqueue (sql/enqueue.sql: the clash check, the insert, the
-- dispatch upsert) and, in the same statement, the fast path's lease on
-- each aggregate whose new versions are its only unpublished ones: one
-- autocommit statement where BEGIN, Enqueue, Claim and COMMIT took four.
--
-- An aggregate is leased here when nothing else is in its way: it is not
-- FAILED, not leased by a relay (no lease, or an expired one) nor waiting
-- out a retry (due_at NULL or past), everything enqueued before is published (enqueued_version <=
-- published_version) and the new versions are above the cursor, at most
-- $25 of them. Its run is then exactly the rows this statement inserted,
-- which the caller holds, so no row is read back. The lease is every
-- claim's (sql/claim.sql): the epoch bumped, due again when it expires, so
-- a process that dies before publishing leaves the run to the drain.
-- Any other aggregate is left as Enqueue leaves it (due, for the drain or
-- a claim of its own).
--
-- The dispatch rows of existing aggregates are locked (in key order, as
-- the upsert takes them) before they are judged, so the judgement and the
-- update see the same row. A row a concurrent producer inserted after this
-- statement's snapshot is not judged: the upsert updates it as Enqueue
-- does and leases nothing (EXCLUDED.epoch = 1 marks a row the lock did not
-- see). A row the upsert inserted (xmax = 0) is leased when it has a
-- lease; a row it updated, when the lock judged it so.
--
-- An id that neither this statement inserted nor its snapshot holds was
-- committed by another transaction while the statement ran: the statement
-- then fails, on the outbox's primary key or with a cast error naming
-- "relaybus-outbox-race" (nothing is written), and the caller runs it
-- again, when the row is visible and is judged a duplicate or a clash as
-- any other.
--
-- A scheduled row not yet due (deliver_at after now) is never leased
-- here: its aggregate is left due at the head's deliver_at, as Enqueue
-- leaves it, and the relay publishes it when it is due.
--
-- $1..$21: Enqueue's columns as arrays (see batch.args); $22 now (NULL:
-- the database's clock), $23 owner, $24 lease in seconds, $25 rows per
-- aggregate at most. Rows: kind 'i' (an inserted id, its created_at), 'c'
-- (a clashing id), 'l' (a leased aggregate: type, id, epoch, published
-- cursor, attempts).
WITH t AS (
    SELECT coalesce($22::timestamptz, now()) AS now
), x AS (
    SELECT *
    FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $8::text[])
        WITH ORDINALITY AS x(id, aggregatetype, aggregateid, event_type, version, topic, n)
), seen AS (
    SELECT x.id,
           (o.topic, o.aggregatetype, o.aggregateid, o.event_type, o.version)
               IS DISTINCT FROM (x.topic, x.aggregatetype, x.aggregateid, x.event_type, x.version)
           OR o.payload IS DISTINCT FROM ($6::bytea[])[x.n] AS clash
    FROM x
    JOIN relaybus_outbox o ON o.id = x.id
), clash AS (
    SELECT id FROM seen WHERE clash
), ins AS (
    INSERT INTO relaybus_outbox (id, aggregatetype, aggregateid, event_type, version, payload, occurred_at,
        topic, source, schema_version, payload_type, trace_id, span_id, parent_event_id, correlation_id,
        initiator, expire_at, target_consumer, traceparent, deliver_at, source_version)
    SELECT u.* FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::bytea[],
        $7::timestamptz[], $8::text[], $9::text[], $10::text[], $11::text[], $12::text[], $13::text[],
        $14::text[], $15::text[], $16::jsonb[], $17::timestamptz[], $18::text[], $19::text[], $20::timestamptz[], $21::text[])
        AS u(id, aggregatetype, aggregateid, event_type, version, payload, occurred_at, topic, source,
             schema_version, payload_type, trace_id, span_id, parent_event_id, correlation_id, initiator,
             expire_at, target_consumer, traceparent, deliver_at, source_version)
    WHERE NOT EXISTS (SELECT 1 FROM clash)
      -- An id the outbox holds already (the same event: not a clash) is
      -- skipped here, not by ON CONFLICT DO NOTHING: a speculative insert
      -- writes a confirmation record to the WAL for every row. An id
      -- another transaction commits while the statement runs then fails
      -- the insert on the primary key, and the caller runs the statement
      -- again, as for the race below.
      AND NOT EXISTS (SELECT 1 FROM seen WHERE seen.id = u.id)
      -- This statement writes the dispatch rows itself: the outbox's
      -- insert trigger (migrations/008_any_producer.sql) is off for it.
      AND set_config('relaybus.outbox_dispatch', 'off', true) = 'off'
    RETURNING id, aggregatetype, aggregateid, version, created_at, deliver_at
), agg AS (
    -- ready: no new row is scheduled after now; head_at: the lowest new
    -- version's deliver_at (when the aggregate is due if not leased).
    SELECT aggregatetype, aggregateid, max(version) AS hi, min(version) AS lo, count(*) AS n,
           bool_and(deliver_at IS NULL OR deliver_at <= t.now) AS ready,
           coalesce((array_agg(deliver_at ORDER BY version))[1], t.now) AS head_at
    FROM ins CROSS JOIN t
    GROUP BY aggregatetype, aggregateid, t.now
), cur AS MATERIALIZED (
    SELECT d.aggregatetype, d.aggregateid,
           d.failed_version IS NULL AND (d.due_at IS NULL OR d.due_at <= t.now)
           AND (d.lease_expires_at IS NULL OR d.lease_expires_at <= t.now)
           AND d.enqueued_version <= d.published_version
           AND a.lo > d.published_version AND a.n <= $25 AND a.ready AS claim
    FROM relaybus_outbox_dispatch d
    JOIN agg a ON a.aggregatetype = d.aggregatetype AND a.aggregateid = d.aggregateid
    CROSS JOIN t
    ORDER BY d.aggregatetype, d.aggregateid
    FOR UPDATE OF d
), work AS (
    INSERT INTO relaybus_outbox_dispatch AS d (aggregatetype, aggregateid, enqueued_version, published_version,
        due_at, epoch, lease_owner, lease_expires_at)
    SELECT a.aggregatetype, a.aggregateid, a.hi, a.lo - 1,
           -- A new aggregate is leased at once (due when the lease
           -- expires); EXCLUDED carries the judgement to the update.
           CASE WHEN c.aggregateid IS NULL AND a.n <= $25 AND a.ready THEN t.now + make_interval(secs => $24)
                ELSE a.head_at END,
           CASE WHEN c.aggregateid IS NULL THEN 1 ELSE 0 END,
           CASE WHEN coalesce(c.claim, a.n <= $25 AND a.ready) THEN $23::text END,
           CASE WHEN coalesce(c.claim, a.n <= $25 AND a.ready) THEN t.now + make_interval(secs => $24) END
    FROM agg a
    LEFT JOIN cur c ON c.aggregatetype = a.aggregatetype AND c.aggregateid = a.aggregateid
    CROSS JOIN t
    ORDER BY a.aggregatetype, a.aggregateid
    ON CONFLICT (aggregatetype, aggregateid) DO UPDATE SET
        enqueued_version  = greatest(d.enqueued_version, EXCLUDED.enqueued_version),
        published_version = least(d.published_version, EXCLUDED.published_version),
        ledger_version    = least(d.ledger_version, EXCLUDED.published_version),
        epoch             = CASE WHEN EXCLUDED.epoch = 0 AND EXCLUDED.lease_owner IS NOT NULL
                                 THEN d.epoch + 1 ELSE d.epoch END,
        lease_owner       = CASE WHEN EXCLUDED.epoch = 0 AND EXCLUDED.lease_owner IS NOT NULL
                                 THEN EXCLUDED.lease_owner ELSE d.lease_owner END,
        lease_expires_at  = CASE WHEN EXCLUDED.epoch = 0 AND EXCLUDED.lease_owner IS NOT NULL
                                 THEN EXCLUDED.lease_expires_at ELSE d.lease_expires_at END,
        due_at            = CASE WHEN EXCLUDED.epoch = 0 AND EXCLUDED.lease_owner IS NOT NULL
                                 THEN EXCLUDED.lease_expires_at
                                 WHEN d.failed_version IS NOT NULL THEN NULL
                                 -- a row the lock did not see: due now (a scheduled
                                 -- head then holds it back at the claim, sql/settle.sql)
                                 WHEN EXCLUDED.epoch = 1 THEN coalesce(d.due_at, coalesce($22::timestamptz, now()))
                                 ELSE coalesce(d.due_at, EXCLUDED.due_at) END
    RETURNING d.aggregatetype, d.aggregateid, d.epoch, d.published_version, d.attempts,
              d.lease_owner IS NOT NULL AS has_lease, d.xmax = 0 AS inserted
), race AS (
    SELECT x.id FROM x
    WHERE NOT EXISTS (SELECT 1 FROM clash)
      AND NOT EXISTS (SELECT 1 FROM ins WHERE ins.id = x.id)
      AND NOT EXISTS (SELECT 1 FROM seen WHERE seen.id = x.id)
)
SELECT 'i' AS kind, id, created_at, NULL::text AS aggregatetype, NULL::bigint AS epoch, NULL::bigint AS cursor,
       NULL::integer AS attempts
FROM ins
UNION ALL
SELECT 'c', id, NULL, NULL, NULL, NULL, NULL FROM clash
UNION ALL
SELECT 'l', w.aggregateid, NULL, w.aggregatetype, w.epoch, w.published_version, w.attempts
FROM work w
LEFT JOIN cur c ON c.aggregatetype = w.aggregatetype AND c.aggregateid = w.aggregateid
WHERE CASE WHEN w.inserted THEN w.has_lease ELSE coalesce(c.claim, false) END
UNION ALL
SELECT 'r', id, NULL, NULL, ('relaybus-outbox-race ' || id)::bigint, NULL, NULL FROM race
