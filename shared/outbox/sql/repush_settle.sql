-- Settle re-pushes: delete the ones Pub/Sub acknowledged; for the others
-- record the failure, with a retry at retry_at or FAILED when final.
--
-- $1 now (NULL: the database's clock); one entry per re-push: $2 ids,
-- $3 published, $4 errors, $5 retry_at, $6 final.
WITH t AS (
    SELECT coalesce($1::timestamptz, now()) AS now
), m AS (
    SELECT * FROM unnest($2::bigint[], $3::boolean[], $4::text[], $5::timestamptz[], $6::boolean[])
        AS m(id, published, error, retry_at, final)
), done AS (
    DELETE FROM relaybus_outbox_repush q USING m WHERE q.id = m.id AND m.published
)
UPDATE relaybus_outbox_repush q SET
    attempts = q.attempts + 1, last_error = m.error,
    due_at = CASE WHEN m.final THEN q.due_at ELSE m.retry_at END,
    failed_at = CASE WHEN m.final THEN t.now END
FROM m, t
WHERE q.id = m.id AND NOT m.published
