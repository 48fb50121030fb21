-- $1 subscription: the pause's record, locked until the transaction ends (an
-- operator's pause waits for a resume in progress).
SELECT consumer_id, paused_by, who, endpoint, service_account, audience, reason, paused_at, probe_after, failed_probes
FROM relaybus_inbox_push_pause WHERE subscription = $1 FOR UPDATE
