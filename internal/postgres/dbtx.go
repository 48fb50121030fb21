// Package postgres holds what relaybus's packages share about Postgres:
// the handle their statements run on. It imports pgx and nothing else, so
// the engines and a producer that enqueues link no pool, tracer or retry
// policy by taking a DBTX (internal/pgpool builds the pools).
package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DBTX is what a statement runs on: a pool, a connection or a transaction
// (*pgxpool.Pool, *pgx.Conn and pgx.Tx all are). The packages that run SQL
// (outbox, inbox, projection, the engines) take a DBTX, so their caller
// decides which statements share a transaction.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}
