// Package layering holds the tests that keep relaybus's import graph as
// the architecture says: the engines (shared/relay, shared/consumer,
// shared/projection, shared/outbox, internal/inbox) link no cloud client,
// no OpenTelemetry SDK or exporter and not the ledger's write path; the
// event model (shared/event) is a leaf with no third-party imports; the Go
// client (client/) links no CloudEvents SDK, zap, gRPC or protobuf; the
// broker drivers (shared/broker/pubsub, shared/broker/nats) link neither
// the other and the contract (shared/broker) links neither, and no
// interface outside shared/broker declares the union of the broker's
// methods (broker_test.go reads every Go file's interfaces for it); the
// rollup binary links no pgx or Pub/Sub client (the host opens each
// backend through an opener of its own; rollup pulls NATS itself); the consume binary that ships
// links no demo handler; internal/telemetry links no Postgres driver. The
// tests read the graph with `go list -deps -json`, the graph go build
// links, and a failure names the chain of imports that pulled the
// offender in. The package has no code of its own.
package layering
