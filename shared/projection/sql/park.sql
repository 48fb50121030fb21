-- Park an event that arrived before its predecessor. Returns the event id
-- parked at that version (this one, or one parked there before) and
-- whether this statement parked it.
--
-- $1 consumer, $2 aggregate type, $3 aggregate id, $4 version, $5 event id,
-- $6 event (JSON envelope), $7 topic, $8 subscription, $9 message id,
-- $10 delivery attempt, $11 parked at.
WITH parked AS (
    INSERT INTO relaybus_strict_parked (consumer_id, aggregate_type, aggregate_id, version, event_id, event,
        topic, subscription, message_id, delivery_attempt, parked_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
    ON CONFLICT (consumer_id, aggregate_type, aggregate_id, version) DO NOTHING
    RETURNING event_id
)
SELECT coalesce((SELECT event_id FROM parked),
                (SELECT event_id FROM relaybus_strict_parked
                 WHERE consumer_id = $1 AND aggregate_type = $2 AND aggregate_id = $3 AND version = $4)),
       EXISTS (SELECT 1 FROM parked)
