-- Which of the given events the consumer has applied: its inbox row is
-- applied and the attempt that holds it succeeded (a parked event is held
-- in the inbox by a parked attempt, not applied). The typed mux reads it
-- for the other versions of a change published side by side.
--
-- $1 consumer, $2 event ids.
SELECT i.event_id
FROM relaybus_inbox i
JOIN relaybus_attempts a
  ON a.consumer_id = i.consumer_id AND a.event_id = i.event_id AND a.attempt_no = i.attempt_no
WHERE i.consumer_id = $1 AND i.event_id = ANY($2::text[]) AND i.state = 'applied' AND a.outcome = 'success'
