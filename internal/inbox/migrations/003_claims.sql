-- Claims for handlers whose effect is a call to another service (shared/forward):
-- the engine does not hold a transaction open while such a handler runs. It
-- claims the event first (state 'claimed', committed, with a lease), calls the
-- handler, then records the outcome: 'applied' with the successful attempt,
-- or the row deleted with the failed attempt. A delivery that finds a claim
-- whose lease has run out (its process died between the claim and the
-- record) takes it over and calls again; one that finds a live claim asks for
-- a redelivery. Rows written in the handler's own transaction are 'applied'
-- from the start.
ALTER TABLE relaybus_inbox ADD COLUMN IF NOT EXISTS state text NOT NULL DEFAULT 'applied';
ALTER TABLE relaybus_inbox ADD COLUMN IF NOT EXISTS lease_until timestamptz;
