-- Fewer WAL records per delivery (docs/decisions/inbox-writes-per-attempt.md).
--
-- 1. The retention indexes keyed by the hour. A block-range index keeps,
--    for each range of pages, the lowest and the highest value of the
--    range's rows; a row inserted into a range whose summary does not cover
--    its value widens the summary, a WAL record about as large as a B-tree
--    entry. On processed_at and consumed_at every insert into a summarized
--    range did (each row is newer than any before it): in the first range
--    of a table (summarized, empty, when the index was built) and wherever
--    the purge freed space that new rows reuse. Keyed by the hour, a
--    range's summary widens at most once an hour; the purge still finds the
--    old ranges and filters their rows by the time itself (sql/purge.sql).
--    relaybus_inbox_hour is the hour since the Unix epoch, the same in
--    every time zone (so IMMUTABLE, as an index expression must be).
CREATE OR REPLACE FUNCTION relaybus_inbox_hour(t timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN floor(extract(epoch FROM t) / 3600)::bigint;

CREATE INDEX IF NOT EXISTS relaybus_inbox_processed_hour
    ON relaybus_inbox USING brin (relaybus_inbox_hour(processed_at)) WITH (autosummarize = on);
DROP INDEX IF EXISTS relaybus_inbox_processed_at_brin;
CREATE INDEX IF NOT EXISTS relaybus_attempts_consumed_hour
    ON relaybus_attempts USING brin (relaybus_inbox_hour(consumed_at)) WITH (autosummarize = on);
DROP INDEX IF EXISTS relaybus_attempts_consumed_at_brin;

-- 2. No seq on the attempts: it served the unshipped index that migration
--    004 dropped, and nothing reads it since. Each attempt was 8 bytes
--    larger, and its sequence wrote a WAL record every 32 attempts.
ALTER TABLE relaybus_attempts DROP COLUMN IF EXISTS seq;

-- 3. The unshipped queue without a primary key. The queue is short (an
--    attempt stays in it from its commit until the ledger has it, about a
--    second) and its keys are unique without one (an attempt is queued by
--    the statement that records it, under the attempts' primary key). Its
--    rows are deleted by tuple id, which the statement that queues an
--    attempt and the shipping step's read return, checked against the
--    key; an attempt whose tuple id the caller does not hold is deleted by
--    its key, reading the queue. Each queued attempt wrote a B-tree entry
--    (~110 B of WAL) that only that delete used.
ALTER TABLE relaybus_inbox_unshipped DROP CONSTRAINT IF EXISTS relaybus_inbox_unshipped_pkey;
