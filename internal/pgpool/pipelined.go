package pgpool

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relaybus/relaybus/shared/postgres"
)

// BeginWith begins a transaction on a pooled connection and runs sql (with
// args) in it, BEGIN and sql sent together in one round trip (pgx's
// Batch.BeginTx), and scans sql's one row into dest. It returns the open
// transaction, a *Tx: the caller commits or rolls it back as any other, or
// ends it with CommitWith. A refused or lost connection is retried as
// Begin's is: nothing sent on a connection that died can have committed.
// When sql fails, the transaction is rolled back and sql's error returned
// (pgx.ErrNoRows when it returned no row).
func (p *Pool) BeginWith(ctx context.Context, dest []any, sql string, args ...any) (pgx.Tx, error) {
	var tx *Tx
	err := p.do(ctx, Lost, func() error {
		c, err := p.Acquire(ctx)
		if err != nil {
			return err
		}
		b := &pgx.Batch{}
		b.BeginTx(pgx.TxOptions{})
		scanned := false
		b.Queue(sql, args...).QueryRow(func(row pgx.Row) error {
			if err := row.Scan(dest...); err != nil {
				return err
			}
			scanned = true
			return nil
		})
		br := c.SendBatch(ctx, b)
		t := &Tx{Tx: br.Tx(), conn: c}
		err = br.Close()
		if err == nil && !scanned {
			err = pgx.ErrNoRows
		}
		if err != nil {
			// Ends what began and gives the connection back (a
			// connection still inside a transaction is closed, not
			// reused).
			t.rollbackAfter(ctx)
			return err
		}
		tx = t
		return nil
	})
	if err != nil {
		return nil, err
	}
	return tx, nil
}

// Tx is a transaction BeginWith began: a pgx.Tx that gives its connection
// back to the pool when it ends, and that can end with CommitWith. Once it
// ended, every method answers pgx.ErrTxClosed.
type Tx struct {
	pgx.Tx
	conn *pgxpool.Conn // nil once the transaction ended
}

// ErrLastStatement marks CommitWith's error when its statement failed: the
// transaction was rolled back, nothing of it committed.
var ErrLastStatement = postgres.ErrLastStatement

// Commit commits the transaction and gives its connection back.
func (t *Tx) Commit(ctx context.Context) error {
	err := t.Tx.Commit(ctx)
	t.end()
	return err
}

// Rollback rolls the transaction back and gives its connection back.
func (t *Tx) Rollback(ctx context.Context) error {
	err := t.Tx.Rollback(ctx)
	t.end()
	return err
}

// CommitWith runs sql (with args) as the transaction's last statement and
// commits, both sent in one round trip where running the statement and
// then committing takes two. scan, when not nil, is given the statement's
// first row (pgx.ErrNoRows from its Scan when it returned none) as the
// answer arrives, before the commit's own answer is read: it must only
// observe. CommitWith returns nil when the transaction committed; an error
// wrapping ErrLastStatement (with the statement's) when the statement
// failed, the transaction then rolled back; any other error is the
// commit's (its outcome unknown when the connection was lost, as for
// Commit).
func (t *Tx) CommitWith(ctx context.Context, sql string, args []any, scan func(pgx.Row) error) error {
	if t.conn == nil {
		return pgx.ErrTxClosed
	}
	b := &pgx.Batch{}
	q := b.Queue(sql, args...)
	var scanErr error
	if scan != nil {
		q.QueryRow(func(row pgx.Row) error {
			scanErr = scan(row)
			return nil
		})
	}
	committed := false
	b.Queue("commit").Exec(func(tag pgconn.CommandTag) error {
		committed = tag.String() == "COMMIT"
		return nil
	})
	err := t.Tx.SendBatch(ctx, b).Close()
	pc := t.conn.Conn().PgConn()
	switch {
	case committed && pc.TxStatus() == 'I':
		t.end()
		return nil
	case !pc.IsClosed() && pc.TxStatus() == 'E':
		// The statement failed: the server skipped the commit, and the
		// transaction waits for its rollback.
		t.rollbackAfter(ctx)
		if err == nil {
			err = scanErr
		}
		return fmt.Errorf("%w: %w", ErrLastStatement, err)
	}
	// The commit failed (the server rolled back), or the connection is
	// gone: the connection is closed rather than reused either way.
	t.end()
	if err == nil {
		err = errors.New("the commit was not acknowledged")
	}
	return err
}

// rollbackAfter rolls back a transaction whose statement failed, even when
// ctx has ended, within rollbackTimeout (a connection that does not answer
// is closed), and gives the connection back.
func (t *Tx) rollbackAfter(ctx context.Context) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	_ = t.Rollback(rctx)
}

// rollbackTimeout bounds rollbackAfter.
const rollbackTimeout = 10 * time.Second

// end gives the connection back (the pool closes one still inside a
// transaction) and leaves the Tx closed.
func (t *Tx) end() {
	if t.conn == nil {
		return
	}
	t.conn.Release()
	t.conn = nil
	t.Tx = closedTx()
}

// closedTx is a pgx.Tx whose every method answers pgx.ErrTxClosed.
func closedTx() pgx.Tx {
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	return pgx.FailedBatchResults(b, pgx.ErrTxClosed).Tx()
}
