-- A rebuild clears consumer $1's inbox, so that the messages a seek
-- delivers again are applied rather than answered as duplicates.
WITH d AS (DELETE FROM relaybus_inbox WHERE consumer_id = $1 RETURNING 1)
SELECT count(*) FROM d
