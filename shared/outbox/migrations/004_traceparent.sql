-- The producer's W3C trace context at enqueue ("00-<trace>-<span>-<flags>"),
-- written by Enqueue from the producer's context (an HTTP publish's request
-- span, a Go producer's span, a handler's span for the child events it
-- emits): the relay's publish span links to it and the Pub/Sub message
-- carries it (googclient_traceparent), so consumers continue the trace.
-- NULL when telemetry was off.
ALTER TABLE relaybus_outbox ADD COLUMN IF NOT EXISTS traceparent text;
