-- Fewer rows and index entries per attempt (docs/decisions/inbox-writes-per-attempt.md).
--
-- 1. No counter table. An attempt's number is the next after the highest the
--    consumer has used for the event: the inbox row's attempt_no (a claim or
--    an application) and the attempts' primary key (every counted attempt is
--    recorded there). Both are read through their primary keys, so numbering
--    costs no write of its own.
-- 2. An unshipped queue instead of shipped_at: each attempt is queued in
--    relaybus_inbox_unshipped (a key, in the same statement that records it)
--    and the queue row is deleted once the ledger has the attempt, instead of
--    rewriting the attempt (a new heap tuple and a new entry in each of its
--    indexes) to set shipped_at.
-- 3. Retention by BRIN indexes: the inbox and the attempts are appended in
--    time order, so a block-range index finds the old rows for a purge; an
--    insert writes no entry, at most a summary update.

CREATE TABLE IF NOT EXISTS relaybus_inbox_unshipped (
    consumer_id text    NOT NULL,
    event_id    text    NOT NULL,
    attempt_no  integer NOT NULL,
    PRIMARY KEY (consumer_id, event_id, attempt_no)
);

-- Upgrade: the attempts the ledger did not have yet go to the queue.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM information_schema.columns
               WHERE table_schema = current_schema() AND table_name = 'relaybus_attempts' AND column_name = 'shipped_at') THEN
        INSERT INTO relaybus_inbox_unshipped (consumer_id, event_id, attempt_no)
        SELECT consumer_id, event_id, attempt_no FROM relaybus_attempts WHERE shipped_at IS NULL
        ON CONFLICT DO NOTHING;
        DROP INDEX IF EXISTS relaybus_attempts_unshipped;
        ALTER TABLE relaybus_attempts DROP COLUMN shipped_at;
    END IF;
END
$$;

DROP TABLE IF EXISTS relaybus_inbox_attempts;

DROP INDEX IF EXISTS relaybus_inbox_processed_at;
CREATE INDEX IF NOT EXISTS relaybus_inbox_processed_at_brin
    ON relaybus_inbox USING brin (processed_at) WITH (autosummarize = on);
DROP INDEX IF EXISTS relaybus_attempts_consumed_at;
CREATE INDEX IF NOT EXISTS relaybus_attempts_consumed_at_brin
    ON relaybus_attempts USING brin (consumed_at) WITH (autosummarize = on);
