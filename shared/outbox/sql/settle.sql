-- Settle: end the leases of a batch in one statement, recording for each
-- aggregate what Pub/Sub acknowledged (its cursor moves from the run's
-- from_version to to_version) and, when a publish failed, the failure of
-- the version after to_version: a retry at retry_at, or FAILED when final
-- (the aggregate is blocked until an operator re-pushes). An aggregate
-- with more to publish is due again at once, or at its next version's
-- deliver_at when that version is scheduled (the claim stopped before it).
--
-- Only a relay that still holds the lease it claimed (same epoch) and
-- whose run started at the current cursor may settle, so a relay whose
-- lease expired and was taken over changes nothing. The cursor moves only
-- when every row between from_version and to_version is one the relay
-- published ("whole"; a cancelled row is in no run, and counts for
-- none); a row that committed inside that range after the
-- run was read (a producer that wrote an older version late) keeps the
-- cursor where it was, and the run is published again.
--
-- The statement locks the aggregates it settles %s (the caller settles the
-- ones a producer's open transaction holds afterwards, one at a time).
--
-- $1 now (NULL: the database's clock); $2..$11 one entry per aggregate:
-- type, id, epoch, from_version, to_version, rows published, the failed
-- version (NULL: none), its error, retry_at and final; $12 whether the
-- ledger records sends (then the healing step may record them after $13
-- seconds unless the live recorder did). Returns each settled aggregate,
-- whether its run was whole, and its next event when it is due again.
WITH t AS (
    SELECT coalesce($1::timestamptz, now()) AS now
), m AS (
    SELECT * FROM unnest($2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::bigint[], $7::integer[],
                         $8::bigint[], $9::text[], $10::timestamptz[], $11::boolean[])
        AS m(aggregatetype, aggregateid, epoch, from_version, to_version, rows,
             fail_version, fail_error, retry_at, final)
), locked AS (
    SELECT d.aggregatetype, d.aggregateid
    FROM relaybus_outbox_dispatch d
    JOIN m ON d.aggregatetype = m.aggregatetype AND d.aggregateid = m.aggregateid
    WHERE d.epoch = m.epoch AND d.published_version = m.from_version
    ORDER BY d.aggregatetype, d.aggregateid
    FOR UPDATE OF d %s
), checked AS (
    SELECT m.*,
           (SELECT count(*) FROM relaybus_outbox o
             WHERE o.aggregatetype = m.aggregatetype AND o.aggregateid = m.aggregateid
               AND o.version > m.from_version AND o.version <= m.to_version
               AND NOT EXISTS (SELECT 1 FROM relaybus_outbox_cancelled x WHERE x.event_id = o.id)) = m.rows AS whole
    FROM m
    JOIN locked l ON l.aggregatetype = m.aggregatetype AND l.aggregateid = m.aggregateid
), settled AS (
    SELECT c.*,
           c.whole AND c.to_version > c.from_version AS moved,
           CASE WHEN c.whole THEN c.to_version ELSE c.from_version END AS cursor,
           c.whole AND c.fail_version IS NOT NULL AS failed
    FROM checked c
)
UPDATE relaybus_outbox_dispatch d SET
    published_version = s.cursor,
    published_at      = CASE WHEN s.moved THEN t.now ELSE d.published_at END,
    attempts          = CASE WHEN NOT s.whole THEN d.attempts
                             WHEN NOT s.failed THEN 0
                             WHEN s.moved THEN 1
                             ELSE d.attempts + 1 END,
    last_error        = CASE WHEN s.failed THEN s.fail_error WHEN s.whole THEN NULL ELSE d.last_error END,
    failed_version    = CASE WHEN s.failed AND s.final THEN s.fail_version END,
    failed_at         = CASE WHEN s.failed AND s.final THEN t.now END,
    lease_owner       = NULL,
    lease_expires_at  = NULL,
    due_at            = CASE WHEN s.failed AND s.final THEN NULL
                             WHEN s.failed THEN s.retry_at
                             -- more to publish: due now, or when its first
                             -- version is scheduled (deliver_at), then
                             WHEN d.enqueued_version > s.cursor THEN greatest(t.now, coalesce(
                                 (SELECT o.deliver_at FROM relaybus_outbox o
                                   WHERE o.aggregatetype = d.aggregatetype AND o.aggregateid = d.aggregateid
                                     AND o.version > s.cursor
                                   ORDER BY o.version LIMIT 1), t.now))
                             ELSE NULL END,
    ledger_due_at     = CASE WHEN $12 AND s.moved
                             THEN coalesce(d.ledger_due_at, t.now + make_interval(secs => $13))
                             ELSE d.ledger_due_at END
FROM settled s, t
WHERE d.aggregatetype = s.aggregatetype AND d.aggregateid = s.aggregateid
RETURNING d.aggregatetype, d.aggregateid, s.whole,
    -- next: the first unpublished version's event when the aggregate is due
    -- again at once (versions were enqueued while it was leased), for the
    -- relay to kick; NULL otherwise.
    CASE WHEN d.due_at = t.now AND d.enqueued_version > d.published_version THEN
        (SELECT o.id FROM relaybus_outbox o
          WHERE o.aggregatetype = d.aggregatetype AND o.aggregateid = d.aggregateid
            AND o.version > d.published_version
          ORDER BY o.version LIMIT 1) END
