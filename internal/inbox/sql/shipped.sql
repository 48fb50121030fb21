-- The ledger has these attempts: they leave the unshipped queue.
-- $1 consumers, $2 event ids, $3 numbers.
DELETE FROM relaybus_inbox_unshipped q
USING unnest($1::text[], $2::text[], $3::integer[]) AS m(consumer_id, event_id, attempt_no)
WHERE q.consumer_id = m.consumer_id AND q.event_id = m.event_id AND q.attempt_no = m.attempt_no
