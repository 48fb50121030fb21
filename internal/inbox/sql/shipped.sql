-- The ledger has these attempts: they leave the unshipped queue, found by
-- their tuple ids ($4; the queue has no index, migration 006) and deleted
-- when the row there is one of the attempts (its key is among $1..$3: a
-- tuple id whose row was deleted and whose space another attempt took
-- since deletes nothing).
-- $1 consumers, $2 event ids, $3 numbers, $4 tuple ids.
DELETE FROM relaybus_inbox_unshipped q
WHERE q.ctid = ANY($4::tid[])
  AND (q.consumer_id, q.event_id, q.attempt_no) IN (
      SELECT * FROM unnest($1::text[], $2::text[], $3::integer[]))
