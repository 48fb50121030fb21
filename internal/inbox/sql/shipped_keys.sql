-- The ledger has these attempts, whose queue rows' tuple ids the caller
-- does not hold: they leave the unshipped queue, found by their keys (a
-- read of the queue, which has no index).
-- $1 consumers, $2 event ids, $3 numbers.
DELETE FROM relaybus_inbox_unshipped q
USING unnest($1::text[], $2::text[], $3::integer[]) AS m(consumer_id, event_id, attempt_no)
WHERE q.consumer_id = m.consumer_id AND q.event_id = m.event_id AND q.attempt_no = m.attempt_no
