-- Re-push clear failed: an aggregate FAILED at the re-pushed event flows
-- again from it: the failure cleared, attempts back to 0, due now.
--
-- $1 aggregate type, $2 aggregate id.
UPDATE relaybus_outbox_dispatch SET failed_version = NULL, failed_at = NULL,
    attempts = 0, last_error = NULL, due_at = now()
WHERE aggregatetype = $1 AND aggregateid = $2
