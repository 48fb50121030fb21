-- The ledger has these attempts. $1 consumers, $2 event ids, $3 numbers.
UPDATE relaybus_attempts a SET shipped_at = now()
FROM unnest($1::text[], $2::text[], $3::integer[]) AS m(consumer_id, event_id, attempt_no)
WHERE a.consumer_id = m.consumer_id AND a.event_id = m.event_id AND a.attempt_no = m.attempt_no
  AND a.shipped_at IS NULL
