-- $1 subscription, $2 probe after, $3 reason: a failed probe of the breaker's pause.
UPDATE relaybus_inbox_push_pause SET failed_probes = failed_probes + 1, probe_after = $2, reason = $3
WHERE subscription = $1 AND paused_by = 'breaker'
