-- $1 subscription: the pause's record, if any.
SELECT consumer_id, paused_by, who, endpoint, service_account, audience, reason, paused_at, probe_after, failed_probes
FROM relaybus_inbox_push_pause WHERE subscription = $1
