-- Any producer: a row inserted into the outbox by plain SQL (any language,
-- any driver, no relaybus code) is published like one enqueued through Go
-- (docs/producing.md, "Producing from any language").
--
-- 0. The producer's own version (its release, build or revision), an
--    envelope field (shared/event's SourceVersion), NULL when it gave none.
ALTER TABLE relaybus_outbox ADD COLUMN IF NOT EXISTS source_version text;

-- 1. Defaults for what Go's Enqueue fills in when the producer leaves it
--    out: an id, the occurrence time, a trace id, the schema version and
--    the payload type. Enqueue always sends them; a default only changes
--    the catalog (no table rewrite).
ALTER TABLE relaybus_outbox
    ALTER COLUMN id SET DEFAULT gen_random_uuid()::text,
    ALTER COLUMN occurred_at SET DEFAULT now(),
    ALTER COLUMN trace_id SET DEFAULT replace(gen_random_uuid()::text, '-', ''),
    ALTER COLUMN schema_version SET DEFAULT 'v1',
    ALTER COLUMN payload_type SET DEFAULT 'application/json';

-- 2. Whether a payload is JSON, for the trigger's check (PostgreSQL 15 has
--    no IS JSON): the cast parses it, and a failure is a no.
CREATE OR REPLACE FUNCTION relaybus_outbox_is_json(payload bytea) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    PERFORM convert_from(payload, 'UTF8')::jsonb;
    RETURN true;
EXCEPTION WHEN others THEN
    RETURN false;
END
$$;

-- 3. The dispatch row. The relay reads aggregates' dispatch rows, not the
--    outbox: Enqueue writes the dispatch row in its own statement
--    (sql/enqueue.sql). This trigger does the same for every other INSERT,
--    once per statement, from the rows the statement inserted: the same
--    upsert (a scheduled head makes its aggregate due at its deliver_at,
--    migration 007), so an aggregate's versions are published in order whoever
--    wrote them, and a version at or below the published cursor sends the
--    cursor back below it.
--
--    First every row is checked against the rules Enqueue checks in Go
--    (shared/event's Validate): the first row that breaks one fails the
--    statement with check_violation, a message that names the event, the
--    column and the rule, and the column in the error's column field.
--
--    relaybus.outbox_dispatch = 'off' (set_config(..., true)) turns the
--    trigger off for the next INSERT statement only (the trigger clears
--    it). relaybus's own statements set it: Enqueue's, which check the
--    events and write the dispatch rows themselves, and a re-push's, which
--    puts an event that retention deleted back as already published.
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
            WHEN octet_length(n.payload) > 9934464
                THEN 'payload'
            WHEN lower(split_part(n.payload_type, ';', 1)) ~ '^\s*(application/json|text/json|.*\+json)\s*$'
                 AND NOT relaybus_outbox_is_json(n.payload)
                THEN 'payload'
            WHEN lower(split_part(n.payload_type, ';', 1)) !~ '^\s*(application/json|text/json|.*\+json)\s*$'
                 AND octet_length(n.payload) > 7450848
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
            WHEN 'payload' THEN 'valid JSON for a JSON payload type; at most 9,934,464 bytes (7,450,848 for a payload that is not JSON)'
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

DROP TRIGGER IF EXISTS relaybus_outbox_enqueued ON relaybus_outbox;
CREATE TRIGGER relaybus_outbox_enqueued
    AFTER INSERT ON relaybus_outbox
    REFERENCING NEW TABLE AS relaybus_inserted
    FOR EACH STATEMENT
    EXECUTE FUNCTION relaybus_outbox_enqueued();
