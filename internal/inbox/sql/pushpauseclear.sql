-- $1 subscription, $2 paused_by ('' for any): lift the record of a pause.
DELETE FROM relaybus_inbox_push_pause WHERE subscription = $1 AND ($2 = '' OR paused_by = $2)
