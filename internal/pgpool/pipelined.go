package pgpool

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// BeginWith begins a transaction on a pooled connection and runs sql (with
// args) in it, BEGIN and sql sent together in one round trip (pgx's
// Batch.BeginTx), and scans sql's one row into dest. It returns the open
// transaction; the caller commits or rolls it back as any other. A refused
// or lost connection is retried as Begin's is: nothing sent on a
// connection that died can have committed. When sql fails, the
// transaction is rolled back and sql's error returned (pgx.ErrNoRows when
// it returned no row).
func (p *Pool) BeginWith(ctx context.Context, dest []any, sql string, args ...any) (pgx.Tx, error) {
	var tx pgx.Tx
	err := p.do(ctx, Lost, func() error {
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
		br := p.Pool.SendBatch(ctx, b)
		t := br.Tx()
		err := br.Close()
		if err == nil && !scanned {
			err = pgx.ErrNoRows
		}
		if err != nil {
			// Ends what began (a closed transaction only releases its
			// connection) and gives the connection back.
			_ = t.Rollback(context.WithoutCancel(ctx))
			return err
		}
		tx = t
		return nil
	})
	return tx, err
}
