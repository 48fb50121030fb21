-- The next attempt number of the consumer at an event it already holds (a
-- parked event applied in another event's transaction): the next after the
-- highest it has used (the inbox row's, the recorded attempts'). Run after
-- lock.sql in the same transaction, so that it reads what a concurrent
-- transaction settling the same event committed while this one waited.
--
-- $1 consumer, $2 event id.
SELECT greatest((SELECT max(attempt_no) FROM relaybus_attempts WHERE consumer_id = $1 AND event_id = $2),
                (SELECT attempt_no FROM relaybus_inbox WHERE consumer_id = $1 AND event_id = $2), 0) + 1
