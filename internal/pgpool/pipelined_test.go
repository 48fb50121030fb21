package pgpool

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	neturl "net/url"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/relaybus/relaybus/internal/pgtest"
)

// BeginWith's transaction, direct and through PgBouncer in transaction
// mode (exec query mode): its first statement's row is read, the rest of
// the transaction runs on the same server connection, commit and rollback
// do what they say, and a first statement that fails or returns no row
// leaves no transaction open and no connection held.
func TestBeginWith(t *testing.T) {
	urls := map[string]string{"direct": pgtest.URL(t)}
	if bouncer := pgtest.PgBouncerURL(t); bouncer != "" {
		u, _ := neturl.Parse(bouncer)
		q := u.Query()
		q.Set("default_query_exec_mode", "exec")
		u.RawQuery = q.Encode()
		urls["pgbouncer"] = u.String()
	}
	for name, url := range urls {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			p := open(t, url, 2)
			var b [4]byte
			_, _ = rand.Read(b[:])
			table := "t_begin_with_" + hex.EncodeToString(b[:])
			if _, err := p.Exec(ctx, "CREATE TABLE "+table+" (id int PRIMARY KEY)"); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _, _ = p.Exec(context.Background(), "DROP TABLE "+table) })
			count := func() (n int) {
				t.Helper()
				if err := p.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}
			insert := "INSERT INTO " + table + " (id) VALUES ($1) RETURNING id"

			var id int
			tx, err := p.BeginWith(ctx, []any{&id}, insert, 1)
			if err != nil || id != 1 {
				t.Fatalf("begin with an insert: id %d, %v", id, err)
			}
			// The transaction goes on on its connection: it sees its row,
			// nobody else does before the commit.
			var mine int
			if err := tx.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&mine); err != nil || mine != 1 {
				t.Fatalf("the transaction sees %d rows, %v; want its own", mine, err)
			}
			if n := count(); n != 0 {
				t.Fatalf("%d rows visible before the commit", n)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if n := count(); n != 1 {
				t.Fatalf("%d rows after the commit, want 1", n)
			}

			tx, err = p.BeginWith(ctx, []any{&id}, insert, 2)
			if err != nil {
				t.Fatal(err)
			}
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			if n := count(); n != 1 {
				t.Fatalf("%d rows after a rollback, want 1", n)
			}

			// A first statement that fails: its error, nothing held.
			_, err = p.BeginWith(ctx, []any{&id}, insert, 1)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "23505" {
				t.Fatalf("a duplicate key: %v, want SQLSTATE 23505", err)
			}
			_, err = p.BeginWith(ctx, []any{&id}, "SELECT id FROM "+table+" WHERE id = $1", 99)
			if !errors.Is(err, pgx.ErrNoRows) {
				t.Fatalf("no row: %v, want pgx.ErrNoRows", err)
			}
			if n := p.Stat().AcquiredConns(); n != 0 {
				t.Fatalf("%d connections held after the failures, want 0", n)
			}
			// Both connections are usable and outside any transaction.
			for i := range 2 {
				tx, err := p.BeginWith(ctx, []any{&id}, insert, 10+i)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback(ctx) //nolint:errcheck // committed below
				if err := tx.Commit(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if n := count(); n != 3 {
				t.Fatalf("%d rows, want 3", n)
			}
		})
	}
}
