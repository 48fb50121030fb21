-- Which migrations of the projection tables exist in the search_path: the
-- first (relaybus_projection, relaybus_strict_position) and the second
-- (the resequencer's parked and skipped versions).
SELECT to_regclass('relaybus_projection') IS NOT NULL, to_regclass('relaybus_strict_skipped') IS NOT NULL
