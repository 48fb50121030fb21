-- Claim an event for a handler that calls another service (shared/forward),
-- in a transaction of its own that commits before the call: count one more
-- attempt and insert the inbox row as 'claimed' with a lease, or take over
-- a claim whose lease has run out (the process that held it died between
-- its claim and its record). An applied row, or a claim still leased, is
-- left alone (the caller rolls back, which undoes the count). A concurrent
-- claim of the same event waits on the counter's row, then finds the claim.
--
-- $1 consumer, $2 event id, $3 lease in milliseconds. Returns the attempt
-- number, whether the row was claimed and, when it was taken over, the
-- attempt number of the claim it replaced (NULL otherwise).
WITH counted AS (
    INSERT INTO relaybus_inbox_attempts AS a (consumer_id, event_id, attempts) VALUES ($1, $2, 1)
    ON CONFLICT (consumer_id, event_id) DO UPDATE SET attempts = a.attempts + 1, last_at = now()
    RETURNING attempts
), prior AS (
    SELECT attempt_no FROM relaybus_inbox
    WHERE consumer_id = $1 AND event_id = $2 AND state = 'claimed'
), claimed AS (
    INSERT INTO relaybus_inbox AS i (consumer_id, event_id, attempt_no, state, lease_until)
    SELECT $1, $2, attempts, 'claimed', clock_timestamp() + make_interval(secs => $3::double precision / 1000)
    FROM counted
    ON CONFLICT (consumer_id, event_id) DO UPDATE
        SET attempt_no = EXCLUDED.attempt_no, lease_until = EXCLUDED.lease_until, processed_at = now()
        WHERE i.state = 'claimed' AND i.lease_until <= clock_timestamp()
    RETURNING attempt_no
)
SELECT (SELECT attempts FROM counted), EXISTS (SELECT 1 FROM claimed),
       CASE WHEN EXISTS (SELECT 1 FROM claimed) THEN (SELECT attempt_no FROM prior) END
