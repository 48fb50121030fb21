-- Give up a claim (claim.sql) whose call is not counted as an attempt: the
-- inbox row goes and nothing is recorded, so the event's next claim takes
-- the same attempt number. A claim another attempt took over stays.
--
-- $1 consumer, $2 event id, $3 attempt number.
DELETE FROM relaybus_inbox
WHERE consumer_id = $1 AND event_id = $2 AND attempt_no = $3 AND state = 'claimed'
