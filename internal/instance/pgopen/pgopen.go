// Package pgopen is the host's Postgres opener: a function whose
// configuration names a database (instance.Database) opens its pool here.
// It is a package of its own so that a binary whose function uses no
// Postgres (rollup) links no pgx: the host opens only the backends a
// function's configuration names (internal/instance/fsopen for Firestore,
// internal/instance/brokeropen for the broker).
package pgopen

import (
	"context"

	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/internal/migrate"
	"github.com/relaybus/relaybus/internal/pgpool"
)

// Open opens db's pool (internal/pgpool: refused and lost connections
// retried within the caller's deadline), with its statements traced when
// telemetry is on (pgpool.QueryTracer: start telemetry first), and
// applies the migration lines (over db.DirectURL when set).
func Open(ctx context.Context, db instance.Database, lines ...migrate.Line) (*pgpool.Pool, error) {
	return pgpool.Open(ctx, pgpool.Config{URL: db.URL, DirectURL: db.DirectURL, Tracer: pgpool.QueryTracer()}, lines...)
}
