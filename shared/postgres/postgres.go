// Package postgres declares the Postgres handles relaybus's packages take,
// so that your code decides which statements share a transaction: pass a
// *pgxpool.Pool, a *pgx.Conn or a pgx.Tx. It imports pgx and nothing else.
package postgres

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DBTX is what a statement runs on: a pool, a connection or a transaction
// (*pgxpool.Pool, *pgx.Conn and pgx.Tx all are). outbox.Enqueue, the
// consumer's and the projection's statements take a DBTX, so the caller
// decides which statements share a transaction.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Beginner starts transactions (*pgxpool.Pool and *pgx.Conn are
// Beginners): what applying migrations (outbox.Migrate) takes, since each
// migration runs in a transaction of its own.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// ErrLastStatement is wrapped in the error of a transaction's CommitWith
// (the transactions relaybus's pools begin for a delivery) when the last
// statement, sent with the COMMIT, failed: the transaction rolled back and
// nothing of it committed. Any other error from CommitWith is the commit's.
var ErrLastStatement = errors.New("the transaction's last statement failed; nothing was committed")
