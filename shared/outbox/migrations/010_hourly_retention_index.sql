-- The retention index keyed by the hour (docs/decisions/inbox-writes-per-attempt.md,
-- "BRIN by the hour").
--
-- A block-range index keeps, for each range of pages, the lowest and the
-- highest value of the range's rows. A row inserted into a range whose
-- summary does not cover its value widens the summary: a WAL record, about
-- as large as a B-tree entry. On created_at every insert into a summarized
-- range did: each row is newer than any before it. Summarized ranges take
-- inserts in the first range of a table (summarized, empty, when the index
-- was built) and wherever the purge freed space that new rows reuse.
-- Keyed by the hour of created_at, a range's summary widens at most once
-- an hour; the purge still finds the old ranges, and filters their rows by
-- created_at itself (sql/purge.sql).
--
-- relaybus_outbox_hour is the hour since the Unix epoch, the same in every
-- time zone (so IMMUTABLE, as an index expression must be).
CREATE OR REPLACE FUNCTION relaybus_outbox_hour(t timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN floor(extract(epoch FROM t) / 3600)::bigint;

CREATE INDEX IF NOT EXISTS relaybus_outbox_created_hour
    ON relaybus_outbox USING brin (relaybus_outbox_hour(created_at)) WITH (autosummarize = on);
DROP INDEX IF EXISTS relaybus_outbox_created_at_brin;
