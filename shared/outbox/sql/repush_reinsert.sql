-- Re-push reinsert: put an event retention deleted back into the outbox,
-- with the columns of Enqueue's batch (one row), as published: the
-- outbox's insert trigger (migrations/008_any_producer.sql) is off for it,
-- and repush_reinsert_dispatch.sql writes its dispatch row.
--
-- $1..$21 the batch's column arrays, in enqueue.sql's order.
INSERT INTO relaybus_outbox (id, aggregatetype, aggregateid, event_type, version, payload, occurred_at,
    topic, source, schema_version, payload_type, trace_id, span_id, parent_event_id, correlation_id, initiator, expire_at, target_consumer, traceparent, deliver_at, source_version)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::bytea[], $7::timestamptz[],
    $8::text[], $9::text[], $10::text[], $11::text[], $12::text[], $13::text[], $14::text[], $15::text[], $16::jsonb[], $17::timestamptz[], $18::text[], $19::text[], $20::timestamptz[], $21::text[])
WHERE set_config('relaybus.outbox_dispatch', 'off', true) = 'off'
