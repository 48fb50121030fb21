-- What holds an event that could not be claimed (claim.sql), read after the
-- claim statement so that it sees a claim or an application that committed
-- while it waited: 'applied' (with the attempt that applied it), or
-- 'claimed' (with its lease); no row when a concurrent claim has not
-- committed yet.
--
-- $1 consumer, $2 event id.
SELECT state, attempt_no, lease_until FROM relaybus_inbox WHERE consumer_id = $1 AND event_id = $2
