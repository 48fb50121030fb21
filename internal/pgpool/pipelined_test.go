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

// directAndPooled is the test server's URL and, when the suite has one,
// PgBouncer's in transaction mode with pgx's exec query mode.
func directAndPooled(t *testing.T) map[string]string {
	urls := map[string]string{"direct": pgtest.URL(t)}
	if bouncer := pgtest.PgBouncerURL(t); bouncer != "" {
		u, _ := neturl.Parse(bouncer)
		q := u.Query()
		q.Set("default_query_exec_mode", "exec")
		u.RawQuery = q.Encode()
		urls["pgbouncer"] = u.String()
	}
	return urls
}

// scratchTable creates a table (id int PRIMARY KEY) of the test's own,
// dropped when it ends, and returns its name and a counter of its rows.
func scratchTable(t *testing.T, p *Pool, prefix string) (string, func() int) {
	t.Helper()
	ctx := context.Background()
	var b [4]byte
	_, _ = rand.Read(b[:])
	table := prefix + hex.EncodeToString(b[:])
	if _, err := p.Exec(ctx, "CREATE TABLE "+table+" (id int PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = p.Exec(context.Background(), "DROP TABLE "+table) })
	return table, func() (n int) {
		t.Helper()
		if err := p.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
}

// BeginWith's transaction, direct and through PgBouncer in transaction
// mode (exec query mode): its first statement's row is read, the rest of
// the transaction runs on the same server connection, commit and rollback
// do what they say, and a first statement that fails or returns no row
// leaves no transaction open and no connection held.
func TestBeginWith(t *testing.T) {
	for name, url := range directAndPooled(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			p := open(t, url, 2)
			table, count := scratchTable(t, p, "t_begin_with_")
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

// CommitWith, direct and through PgBouncer: the last statement and the
// commit in one round trip (a transaction BeginWith began takes two in
// all), the row given to scan, the connection given back outside any
// transaction; a last statement that fails rolls the whole transaction
// back and says so (ErrLastStatement), and the connection is reused.
func TestCommitWith(t *testing.T) {
	for name, url := range directAndPooled(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			cfg, err := ParseConfig(url)
			if err != nil {
				t.Fatal(err)
			}
			cfg.MaxConns = 1
			trips := &pgtest.RoundTrips{}
			cfg.ConnConfig.Tracer = trips
			p, err := New(ctx, cfg, RetryPolicy{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(p.Close)
			table, count := scratchTable(t, p, "t_commit_with_")
			insert := "INSERT INTO " + table + " (id) VALUES ($1) RETURNING id"

			var id, last int
			before := trips.Count()
			tx, err := p.BeginWith(ctx, []any{&id}, insert, 1)
			if err != nil {
				t.Fatal(err)
			}
			err = tx.(*Tx).CommitWith(ctx, insert, []any{2}, func(row pgx.Row) error { return row.Scan(&last) })
			if err != nil || last != 2 {
				t.Fatalf("CommitWith: row %d, %v; want 2, nil", last, err)
			}
			if n := trips.Count() - before; n != 2 {
				t.Errorf("BEGIN, a statement, a last statement and COMMIT took %d round trips; want 2", n)
			}
			if n := count(); n != 2 {
				t.Fatalf("%d rows after CommitWith; want both statements' (2)", n)
			}
			if _, err := tx.Exec(ctx, "SELECT 1"); !errors.Is(err, pgx.ErrTxClosed) {
				t.Errorf("a statement on the committed transaction: %v; want pgx.ErrTxClosed", err)
			}
			if err := tx.Rollback(ctx); !errors.Is(err, pgx.ErrTxClosed) {
				t.Errorf("Rollback after CommitWith: %v; want pgx.ErrTxClosed", err)
			}

			// A last statement with no row: scan sees pgx.ErrNoRows, the
			// transaction commits.
			tx, err = p.BeginWith(ctx, []any{&id}, insert, 3)
			if err != nil {
				t.Fatal(err)
			}
			var scanned error
			err = tx.(*Tx).CommitWith(ctx, "SELECT id FROM "+table+" WHERE id = $1", []any{99},
				func(row pgx.Row) error { scanned = row.Scan(&last); return scanned })
			if err != nil || !errors.Is(scanned, pgx.ErrNoRows) {
				t.Fatalf("a last statement with no row: %v, scan saw %v; want nil, pgx.ErrNoRows", err, scanned)
			}
			if n := count(); n != 3 {
				t.Fatalf("%d rows; want 3", n)
			}

			// A last statement that fails: nothing of the transaction stays.
			tx, err = p.BeginWith(ctx, []any{&id}, insert, 4)
			if err != nil {
				t.Fatal(err)
			}
			err = tx.(*Tx).CommitWith(ctx, insert, []any{1}, nil)
			var pgErr *pgconn.PgError
			if !errors.Is(err, ErrLastStatement) || !errors.As(err, &pgErr) || pgErr.Code != "23505" {
				t.Fatalf("a duplicate key as the last statement: %v; want ErrLastStatement with SQLSTATE 23505", err)
			}
			if n := count(); n != 3 {
				t.Fatalf("%d rows after a failed last statement; want 3 (the transaction's first insert rolled back too)", n)
			}
			if n := p.Stat().AcquiredConns(); n != 0 {
				t.Fatalf("%d connections held; want 0", n)
			}
			// The pool's one connection serves the next transaction.
			tx, err = p.BeginWith(ctx, []any{&id}, insert, 5)
			if err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil || count() != 4 {
				t.Fatalf("the next transaction: %v, %d rows; want nil, 4", err, count())
			}
		})
	}
}
