-- Lock the inbox row of an event the consumer holds (a parked event), so
-- that the transactions that number and settle attempts at it (next.sql,
-- settle.sql) take turns. Every attempt at an event takes its inbox row
-- before it records anything, so these never deadlock.
--
-- $1 consumer, $2 event id.
SELECT 1 FROM relaybus_inbox WHERE consumer_id = $1 AND event_id = $2 FOR UPDATE
