-- Claim an event for a handler that calls another service (shared/forward),
-- in a transaction of its own that commits before the call: insert the
-- inbox row as 'claimed' with a lease and the attempt's number (the next
-- after the highest the consumer has used for the event: the inbox row's,
-- the recorded attempts'), or take over a claim whose lease has run out
-- (the process that held it died between its claim and its record). An
-- applied row, or a claim still leased, is left alone. A concurrent claim
-- of the same event waits on the inbox row, then finds the claim.
--
-- $1 consumer, $2 event id, $3 lease in milliseconds. Returns the attempt
-- number (NULL when nothing was claimed), whether the row was claimed and,
-- when it was taken over, the attempt number of the claim it replaced
-- (NULL otherwise).
WITH prior AS (
    SELECT attempt_no FROM relaybus_inbox
    WHERE consumer_id = $1 AND event_id = $2 AND state = 'claimed'
), claimed AS (
    INSERT INTO relaybus_inbox AS i (consumer_id, event_id, attempt_no, state, lease_until)
    SELECT $1, $2, coalesce((SELECT max(attempt_no) FROM relaybus_attempts WHERE consumer_id = $1 AND event_id = $2), 0) + 1,
           'claimed', clock_timestamp() + make_interval(secs => $3::double precision / 1000)
    ON CONFLICT (consumer_id, event_id) DO UPDATE
        SET attempt_no = greatest(i.attempt_no + 1, EXCLUDED.attempt_no), lease_until = EXCLUDED.lease_until,
            processed_at = now()
        WHERE i.state = 'claimed' AND i.lease_until <= clock_timestamp()
    RETURNING attempt_no
)
SELECT (SELECT attempt_no FROM claimed), EXISTS (SELECT 1 FROM claimed),
       CASE WHEN EXISTS (SELECT 1 FROM claimed) THEN (SELECT attempt_no FROM prior) END
