-- The signing secrets of hmac forwarders (internal/forwarders): sealed with
-- AES-256-GCM under the key in RELAYBUS_FORWARDERS_KEY (the operators' API
-- and the forwarders service hold it, the database does not), so a reader of
-- this table does not get them. The operators' API generates a secret when a
-- forwarder is added with auth hmac and answers it once; a rotation keeps the
-- previous one signing beside the new one until previous_until.

ALTER TABLE relaybus_inbox_forwarders
    ADD COLUMN IF NOT EXISTS signing_secret          text NOT NULL DEFAULT '',
    ADD COLUMN IF NOT EXISTS previous_signing_secret text NOT NULL DEFAULT '',
    ADD COLUMN IF NOT EXISTS previous_until          timestamptz;
