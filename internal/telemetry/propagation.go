package telemetry

// AttrTraceparent is the Pub/Sub message attribute that carries the W3C
// trace context, as cloud.google.com/go/pubsub/v2's OpenTelemetry tracing
// names it ("googclient_" + the W3C header name).
const AttrTraceparent = "googclient_traceparent"
