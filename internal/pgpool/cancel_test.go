package pgpool

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relaybus/relaybus/internal/pgtest"
)

// A statement whose caller's deadline passes while it waits on a lock is
// cancelled in the server, and its connection stays in the pool: the next
// statement runs on the same backend, with no new connection to open
// (under a burst of timeouts, reopening connections is what kept a pool
// from recovering), and the cancelled statement never runs later.
func TestStatementPastItsDeadlineIsCancelledAndItsConnectionKept(t *testing.T) {
	ctx := context.Background()
	url := pgtest.URL(t)
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	table := strconv.Quote("pgpool_cancel_" + strconv.FormatInt(time.Now().UnixNano(), 36))
	if _, err := admin.Exec(ctx, "CREATE TABLE "+table+" (id int PRIMARY KEY, n int); INSERT INTO "+table+" VALUES (1, 0)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP TABLE "+table) })

	// The lock's holder: a transaction left open on a connection of its own.
	hconn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer hconn.Close(ctx)
	holder, err := hconn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx) //nolint:errcheck // the test's end
	if _, err := holder.Exec(ctx, "UPDATE "+table+" SET n = n + 1 WHERE id = 1"); err != nil {
		t.Fatal(err)
	}

	p := open(t, url, 1)
	var before int
	if err := p.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&before); err != nil {
		t.Fatal(err)
	}
	qctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := p.Exec(qctx, "UPDATE "+table+" SET n = n + 10 WHERE id = 1"); err == nil {
		t.Fatal("the update succeeded while another transaction held its row")
	}

	var after int
	if err := p.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&after); err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Errorf("after the timeout the pool's connection is backend %d, was %d: the connection was closed and a new one opened", after, before)
	}
	if n := p.Stat().TotalConns(); n != 1 {
		t.Errorf("the pool holds %d connections; want 1", n)
	}
	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := admin.QueryRow(ctx, "SELECT n FROM "+table+" WHERE id = 1").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("n = %d after the holder committed; want 1 (the update whose caller gave up must not run later)", n)
	}
}
