-- Whether the inbox table exists in the search_path (a consumer that never
-- started has none).
SELECT to_regclass('relaybus_inbox') IS NOT NULL
