-- $1 consumer, $2 instance, $3 when it was last at a limit, $4 deliveries
-- it refused: its report, and the rows of the consumer's instances that
-- have not reported for a day deleted.
WITH gone AS (
    DELETE FROM relaybus_inbox_flow
    WHERE consumer_id = $1 AND instance <> $2 AND updated_at < now() - interval '1 day'
)
INSERT INTO relaybus_inbox_flow (consumer_id, instance, at_limit_at, refused) VALUES ($1, $2, $3, $4)
ON CONFLICT (consumer_id, instance) DO UPDATE
    SET at_limit_at = greatest(relaybus_inbox_flow.at_limit_at, excluded.at_limit_at), refused = excluded.refused, updated_at = now()
