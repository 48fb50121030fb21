-- Enqueue: insert the events (an id already in the outbox is skipped) and,
-- in the same statement and so in the producer's transaction, record on
-- each aggregate's dispatch row that it has work: the highest version
-- enqueued, and due now unless a relay holds it (lease or retry) or it is
-- FAILED. A version at or below the published cursor arrived after the
-- aggregate moved past it: the cursor goes back below it, so it is
-- published (and the versions after it again; the consumers' inboxes absorb
-- those), and so does the ledger's cursor, so its send is recorded. Aggregates are upserted in key order, so two producers never lock
-- two aggregates in opposite orders.
--
-- An id the outbox already holds for another event (another topic,
-- aggregate, version, type or payload) is a clash: the statement then
-- writes nothing at all and returns the clashing ids (clash = true), so a
-- repeated id is a duplicate only when it repeats the same event. The
-- check reads each id's row by primary key, as the insert does anyway;
-- the payload array is indexed, not unnested, so large payloads are not
-- copied twice.
--
-- A scheduled event (deliver_at set) makes its aggregate due at its
-- deliver_at when it is the aggregate's new head (the aggregate had
-- nothing pending); behind a pending head the aggregate keeps its due_at,
-- and the relay, which stops at the first version not yet due, sets it
-- (sql/settle.sql).
--
-- $1..$21: the columns as arrays (see batch.args).
WITH clash AS (
    SELECT x.id
    FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $8::text[])
        WITH ORDINALITY AS x(id, aggregatetype, aggregateid, event_type, version, topic, n)
    JOIN relaybus_outbox o ON o.id = x.id
    WHERE (o.topic, o.aggregatetype, o.aggregateid, o.event_type, o.version)
              IS DISTINCT FROM (x.topic, x.aggregatetype, x.aggregateid, x.event_type, x.version)
       OR o.payload IS DISTINCT FROM ($6::bytea[])[x.n]
), ins AS (
    INSERT INTO relaybus_outbox (id, aggregatetype, aggregateid, event_type, version, payload, occurred_at,
        topic, source, schema_version, payload_type, trace_id, span_id, parent_event_id, correlation_id,
        initiator, expire_at, target_consumer, traceparent, deliver_at, source_version)
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::bytea[],
        $7::timestamptz[], $8::text[], $9::text[], $10::text[], $11::text[], $12::text[], $13::text[],
        $14::text[], $15::text[], $16::jsonb[], $17::timestamptz[], $18::text[], $19::text[], $20::timestamptz[], $21::text[])
    WHERE NOT EXISTS (SELECT 1 FROM clash)
      -- This statement writes the dispatch rows itself: the outbox's
      -- insert trigger (migrations/008_any_producer.sql) is off for it.
      AND set_config('relaybus.outbox_dispatch', 'off', true) = 'off'
    ON CONFLICT (id) DO NOTHING
    RETURNING id, aggregatetype, aggregateid, version, deliver_at
), work AS (
    INSERT INTO relaybus_outbox_dispatch AS d (aggregatetype, aggregateid, enqueued_version, published_version, due_at)
    SELECT aggregatetype, aggregateid, max(version), min(version) - 1,
           coalesce((array_agg(deliver_at ORDER BY version))[1], now())
    FROM ins
    GROUP BY aggregatetype, aggregateid
    ORDER BY aggregatetype, aggregateid
    ON CONFLICT (aggregatetype, aggregateid) DO UPDATE SET
        enqueued_version  = greatest(d.enqueued_version, EXCLUDED.enqueued_version),
        published_version = least(d.published_version, EXCLUDED.published_version),
        ledger_version    = least(d.ledger_version, EXCLUDED.published_version),
        due_at            = CASE WHEN d.failed_version IS NOT NULL THEN NULL
                                 ELSE coalesce(d.due_at, EXCLUDED.due_at) END
    RETURNING 1
)
SELECT id, false FROM ins
UNION ALL
SELECT id, true FROM clash
