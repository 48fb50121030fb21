-- $1 consumer: its instances' reports, the latest at a limit first.
SELECT instance, at_limit_at, refused, updated_at FROM relaybus_inbox_flow WHERE consumer_id = $1 ORDER BY at_limit_at DESC
