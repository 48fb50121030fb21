-- Large payloads (docs/producing.md, "Large payloads"): the outbox takes
-- payloads up to 32 MiB (shared/event's MaxClaimCheckPayload), JSON or not.
-- A relay with a claim check publishes a message over its threshold as a
-- reference to the data in Cloud Storage; the outbox keeps the payload
-- itself. Without a claim check an event whose message is over the
-- broker's limit fails at its first publish (FAILED, naming the setting).
--
-- The trigger's function is migration 008's with its payload rule
-- changed: at most 33,554,432 bytes, where 008 allowed 9,934,464 (7,450,848
-- for a payload that is not JSON, which travelled base64-encoded in the
-- message). The trigger itself is unchanged: it calls the function by name.
CREATE OR REPLACE FUNCTION relaybus_outbox_enqueued() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    bad record;
    cleared text;
BEGIN
    IF current_setting('relaybus.outbox_dispatch', true) = 'off' THEN
        -- An assignment, not PERFORM: a simple expression costs no query.
        cleared := set_config('relaybus.outbox_dispatch', '', true);
        RETURN NULL;
    END IF;

    SELECT n.id, f.field, r.rule INTO bad
    FROM relaybus_inserted n
    CROSS JOIN LATERAL (
        SELECT CASE
            WHEN n.id !~ '^[A-Za-z0-9._:-]{1,128}$' OR n.id IN ('.', '..')
                THEN 'id'
            WHEN n.aggregatetype !~ '^[a-z][a-z0-9_-]{0,63}$'
                THEN 'aggregatetype'
            WHEN octet_length(n.aggregateid) NOT BETWEEN 1 AND 256 OR n.aggregateid !~ '^[A-Za-z0-9:_-]+$'
                THEN 'aggregateid'
            WHEN octet_length(n.event_type) > 128 OR n.event_type !~ '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$'
                THEN 'event_type'
            WHEN octet_length(n.topic) > 200
                 OR regexp_replace(n.topic, '\.dlq$', '') !~ '^[a-z][a-z0-9-]{0,62}(\.[a-z][a-z0-9-]{0,62}){1,2}$'
                 OR 'dlq' = ANY (string_to_array(regexp_replace(n.topic, '\.dlq$', ''), '.'))
                THEN 'topic'
            WHEN octet_length(n.source) NOT BETWEEN 1 AND 256 OR n.source ~ '[\x01-\x20\x7f]'
                THEN 'source'
            WHEN n.schema_version !~ '^v[0-9]{1,15}$'
                THEN 'schema_version'
            WHEN btrim(n.payload_type) = '' OR n.payload_type ~ '[\x01-\x1f\x7f]'
                THEN 'payload_type'
            WHEN (n.trace_id <> '' AND n.trace_id !~ '^[A-Za-z0-9._:-]{1,128}$')
                THEN 'trace_id'
            WHEN (n.span_id <> '' AND n.span_id !~ '^[A-Za-z0-9._:-]{1,128}$')
                THEN 'span_id'
            WHEN (n.parent_event_id <> '' AND n.parent_event_id !~ '^[A-Za-z0-9._:-]{1,128}$')
                THEN 'parent_event_id'
            WHEN (n.correlation_id <> '' AND n.correlation_id !~ '^[A-Za-z0-9._:-]{1,128}$')
                THEN 'correlation_id'
            WHEN n.deliver_at > now() + interval '30 days'
                THEN 'deliver_at'
            WHEN (n.source_version <> '' AND n.source_version !~ '^[A-Za-z0-9._:-]{1,128}$')
                THEN 'source_version'
            WHEN octet_length(n.payload) > 33554432
                THEN 'payload'
            WHEN lower(split_part(n.payload_type, ';', 1)) ~ '^\s*(application/json|text/json|.*\+json)\s*$'
                 AND NOT relaybus_outbox_is_json(n.payload)
                THEN 'payload'
        END AS field) f
    CROSS JOIN LATERAL (
        SELECT CASE f.field
            WHEN 'id' THEN '1 to 128 characters of [A-Za-z0-9._:-], not "." or ".."'
            WHEN 'aggregatetype' THEN '1 to 64 characters of [a-z0-9_-], starting with a letter'
            WHEN 'aggregateid' THEN '1 to 256 characters of [A-Za-z0-9:_-]'
            WHEN 'event_type' THEN 'at most 128 characters: dot-separated words of [A-Za-z0-9_-]'
            WHEN 'topic' THEN '<domain>.<aggregate>.<category>: 2 or 3 dot-separated segments of [a-z0-9-] starting with a letter, at most 200 characters'
            WHEN 'source' THEN '1 to 256 bytes, no spaces or control characters'
            WHEN 'schema_version' THEN 'v followed by 1 to 15 digits (v1)'
            WHEN 'payload_type' THEN 'a media type such as application/json'
            WHEN 'deliver_at' THEN 'at most 30 days after now'
            WHEN 'payload' THEN 'valid JSON for a JSON payload type; at most 33,554,432 bytes (32 MiB)'
            ELSE 'at most 128 characters of [A-Za-z0-9._:-]'
        END AS rule) r
    WHERE f.field IS NOT NULL
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'relaybus_outbox: event %: %: %', bad.id, bad.field, bad.rule
            USING ERRCODE = 'check_violation', COLUMN = bad.field, TABLE = 'relaybus_outbox';
    END IF;

    INSERT INTO relaybus_outbox_dispatch AS d (aggregatetype, aggregateid, enqueued_version, published_version, due_at)
    SELECT n.aggregatetype, n.aggregateid, max(n.version), min(n.version) - 1,
           coalesce((array_agg(n.deliver_at ORDER BY n.version))[1], now())
    FROM relaybus_inserted n
    GROUP BY n.aggregatetype, n.aggregateid
    ORDER BY 1, 2
    ON CONFLICT (aggregatetype, aggregateid) DO UPDATE SET
        enqueued_version  = greatest(d.enqueued_version, EXCLUDED.enqueued_version),
        published_version = least(d.published_version, EXCLUDED.published_version),
        ledger_version    = least(d.ledger_version, EXCLUDED.published_version),
        due_at            = CASE WHEN d.failed_version IS NOT NULL THEN NULL
                                 ELSE coalesce(d.due_at, EXCLUDED.due_at) END;
    RETURN NULL;
END
$$;
