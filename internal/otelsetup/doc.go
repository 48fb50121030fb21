// Package otelsetup is the host's half of relaybus's OpenTelemetry: the
// SDK set up from the environment. The functions' hosts (internal/instance,
// the local stack's command) call Setup once per process and ForceFlush
// and the returned Shutdown when they stop; no engine imports this
// package, so a program that links an engine (a producer enqueueing
// through shared/outbox) links the OpenTelemetry API only
// (internal/telemetry), not the SDK, the OTLP exporters, gRPC or oauth2.
//
// Setup reads the standard variables as the OpenTelemetry specification
// defines them
// (https://opentelemetry.io/docs/specs/otel/configuration/sdk-environment-variables/,
// https://opentelemetry.io/docs/specs/otel/protocol/exporter/), builds the
// OTLP exporters (gRPC or HTTP/protobuf), the sampler (Sampler, relaybus's
// policy, or one of the specification's) and the resource, and installs
// them with telemetry.Install. relaybus's own settings exist only where
// the specification has none: where to export (TELEMETRY_EXPORT: Google's
// Telemetry API is not an OTLP endpoint one can name without credentials)
// and relaybus's sampling policy (OTEL_TRACES_SAMPLER=relaybus).
//
// Telemetry is off unless an export is configured (see Config): an OTLP
// endpoint (a local collector, Jaeger, ...) or, on Cloud Run with a
// project, Google's Telemetry (OTLP) API, telemetry.googleapis.com, which
// takes traces and metrics in OTLP as they are
// (https://cloud.google.com/trace/docs/migrate-to-otlp-endpoints). Metrics
// sent there land in Cloud Monitoring with the Prometheus mapping
// (https://cloud.google.com/stackdriver/docs/reference/telemetry/v1.metrics),
// so the dashboard queries them with PromQL.
package otelsetup
