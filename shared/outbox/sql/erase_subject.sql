-- Erase subject: replace with JSON null the payload of every row of topic
-- $1 whose JSON payload names subject $3 at path $2 (a text[] path, as #>>
-- takes it), in the outbox and in its history (009_history.sql). Rows
-- stay, published or not, so the aggregates' version sequences and the
-- relay's cursors are untouched; a row not yet published, or backfilled
-- from the history, is delivered with the null payload. Rows already
-- erased are not counted again. Returns how many rows it changed.
WITH erased AS (
    UPDATE relaybus_outbox SET payload = convert_to('null', 'UTF8')
    WHERE topic = $1
      AND payload <> convert_to('null', 'UTF8')
      AND relaybus_outbox_is_json(payload)
      AND convert_from(payload, 'UTF8')::jsonb #>> $2::text[] = $3
    RETURNING 1
), erased_history AS (
    UPDATE relaybus_outbox_history SET payload = convert_to('null', 'UTF8')
    WHERE topic = $1
      AND payload <> convert_to('null', 'UTF8')
      AND relaybus_outbox_is_json(payload)
      AND convert_from(payload, 'UTF8')::jsonb #>> $2::text[] = $3
    RETURNING 1
)
SELECT (SELECT count(*) FROM erased) + (SELECT count(*) FROM erased_history)
