package pgpool

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"net"
	neturl "net/url"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/relaybus/relaybus/internal/eventually"
	"github.com/relaybus/relaybus/internal/migrate"
	"github.com/relaybus/relaybus/internal/pgbouncer"
	"github.com/relaybus/relaybus/internal/pgcluster"
	"github.com/relaybus/relaybus/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// limitedRole creates a login role allowed limit connections at once and
// returns the test server's URL as that role.
func limitedRole(t *testing.T, limit int) string {
	t.Helper()
	ctx := context.Background()
	base := pgtest.URL(t)
	var b [4]byte
	_, _ = rand.Read(b[:])
	role := "rb_limit_" + hex.EncodeToString(b[:])
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE ROLE "+role+" LOGIN CONNECTION LIMIT "+strconv.Itoa(limit)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), base)
		if err != nil {
			return
		}
		defer conn.Close(context.Background())
		_, _ = conn.Exec(context.Background(), "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", role)
		_, _ = conn.Exec(context.Background(), "DROP ROLE "+role)
	})
	u, err := neturl.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	u.User = neturl.User(role)
	return u.String()
}

func open(t *testing.T, url string, maxConns int) *Pool {
	t.Helper()
	cfg, err := ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = int32(maxConns)
	p, err := New(context.Background(), cfg, RetryPolicy{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// A server that refuses with 53300 too_many_connections makes the call wait
// and retry; once a slot frees it succeeds, within the caller's deadline.
func TestTooManyConnectionsIsRetriedUntilASlotFrees(t *testing.T) {
	url := limitedRole(t, 1)
	ctx := context.Background()
	holder, err := pgx.Connect(ctx, url) // takes the role's only slot
	if err != nil {
		t.Fatal(err)
	}
	p := open(t, url, 2)
	go func() {
		// Free the slot once the pool has been refused at least once.
		eventually.Within(10*time.Second, func() bool { return p.Retries() > 0 })
		holder.Close(context.Background())
	}()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var n int
	if err := p.QueryRow(cctx, "SELECT 41 + 1").Scan(&n); err != nil {
		t.Fatalf("query after a refused connection: %v", err)
	}
	if n != 42 || p.Retries() == 0 {
		t.Fatalf("n = %d, retries = %d; want 42 after at least one retry", n, p.Retries())
	}
}

// When the refusal outlasts the caller's budget, the call gives up before
// its deadline with the server's error (53300), so the caller still has
// time to answer.
func TestRefusalOutlastingTheBudgetReturnsTheErrorBeforeTheDeadline(t *testing.T) {
	url := limitedRole(t, 1)
	ctx := context.Background()
	holder, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(ctx)
	p := open(t, url, 2)
	// 2 s: a refused connection takes a few ms, and up to a few hundred
	// under the race detector on a busy machine; a retry needs room for
	// its wait and twice the last attempt's time.
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err = p.Exec(cctx, "SELECT 1")
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "53300" {
		t.Fatalf("err = %v, want SQLSTATE 53300", err)
	}
	if cctx.Err() != nil {
		t.Fatalf("returned after the deadline; the caller had no time left to answer")
	}
	if p.Retries() == 0 {
		t.Fatalf("no retry within a 2 s budget")
	}
}

// A full pool makes a call wait for a connection within its budget; it does
// not fail.
func TestFullPoolWaitsForAConnection(t *testing.T) {
	p := open(t, pgtest.URL(t), 1)
	ctx := context.Background()
	held, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err := p.Exec(cctx, "SELECT 1")
		done <- err
	}()
	eventually.True(t, 10*time.Second, "the call to wait for the pool", func() bool { return p.Stat().EmptyAcquireCount() > 0 })
	held.Release()
	if err := <-done; err != nil {
		t.Fatalf("call waiting for a full pool: %v", err)
	}
}

// proxy forwards TCP connections to a Postgres server and can go down
// (refusing connections and cutting the open ones) and come back on the
// same port: a database restart as a client sees it.
type proxy struct {
	t      *testing.T
	target string
	addr   string
	mu     sync.Mutex
	ln     net.Listener
	conns  []net.Conn
}

func newProxy(t *testing.T, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{t: t, target: target, addr: ln.Addr().String()}
	p.serve(ln)
	t.Cleanup(p.down)
	return p
}

func (p *proxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(s, c); s.Close() }()
			go func() { _, _ = io.Copy(c, s); c.Close() }()
		}
	}()
}

// down stops listening (connections are refused) and cuts every open one.
func (p *proxy) down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// up listens again on the same port.
func (p *proxy) up() {
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		p.t.Errorf("proxy: listen again on %s: %v", p.addr, err)
		return
	}
	p.serve(ln)
}

// A database that goes away (connections cut, new ones refused) and comes
// back within the caller's budget costs the caller nothing: the pool's
// connections are replaced and the call succeeds.
func TestDatabaseRestartWithinTheBudgetIsInvisible(t *testing.T) {
	u, err := neturl.Parse(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	px := newProxy(t, u.Host)
	u.Host = px.addr
	p := open(t, u.String(), 2)
	ctx := context.Background()
	if _, err := p.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	px.down() // the pooled connection is cut: its next BEGIN is lost
	go func() {
		eventually.Within(10*time.Second, func() bool { return p.Retries() >= 2 })
		px.up()
	}()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tx, err := p.Begin(cctx)
	if err != nil {
		t.Fatalf("begin across a restart: %v", err)
	}
	var one int
	if err := tx.QueryRow(cctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("query in the new transaction: %v", err)
	}
	if err := tx.Commit(cctx); err != nil {
		t.Fatal(err)
	}
}

func TestRetryable(t *testing.T) {
	ctx := context.Background()
	refused := func() error {
		ln, _ := net.Listen("tcp", "127.0.0.1:0")
		addr := ln.Addr().String()
		ln.Close()
		_, err := pgx.Connect(ctx, "postgres://postgres@"+addr+"/postgres?sslmode=disable&connect_timeout=2")
		return err
	}()
	u, _ := neturl.Parse(pgtest.URL(t))
	u.Path = "/no_such_database_here"
	_, unknownDB := pgx.Connect(ctx, u.String())
	_, syntax := open(t, pgtest.URL(t), 1).Exec(ctx, "SELEC 1")
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"connection refused", refused, true},
		{"too many connections", &pgconn.PgError{Code: "53300"}, true},
		{"cannot connect now", &pgconn.PgError{Code: "57P03"}, true},
		{"unknown database", unknownDB, false},
		{"syntax error", syntax, false},
		{"deadline", context.DeadlineExceeded, false},
		{"nil", nil, false},
	} {
		if got := Retryable(c.err); got != c.want {
			t.Errorf("%s: Retryable(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}

func TestOpenMigratesOverTheDirectURL(t *testing.T) {
	ctx := context.Background()
	_, schema := pgtest.SchemaConfig(t, nil)
	// The pool's URL is a role that may not create tables; the direct URL
	// (the owner) runs the migration.
	line := migrate.Line{Name: "postgres_test", Migrations: []migrate.Migration{{Version: 1, Name: "t",
		SQL: "CREATE TABLE IF NOT EXISTS pg_direct_check (id int)"}}}
	reader := limitedRole(t, 5)
	ru, _ := neturl.Parse(reader)
	q := ru.Query()
	q.Set("search_path", schema)
	ru.RawQuery = q.Encode()
	p, err := Open(ctx, Config{URL: ru.String(), DirectURL: pgtest.SchemaURL(t, schema)}, line)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	defer p.Close()
	var owner string
	if err := p.QueryRow(ctx, "SELECT tableowner FROM pg_tables WHERE schemaname = $1 AND tablename = 'pg_direct_check'", schema).Scan(&owner); err != nil {
		t.Fatalf("the migration did not run: %v", err)
	}
	if owner != "postgres" {
		t.Fatalf("table owned by %q, want postgres (the direct URL's user)", owner)
	}
	if _, err := Open(ctx, Config{}); err == nil || err.Error() != "DATABASE_URL is not set" {
		t.Fatalf("empty URL: %v", err)
	}
}

// Through PgBouncer in transaction mode, a client connection's statements
// run on whichever server connection is free: pgx's default mode prepares
// a statement on one and later runs it on another, where it does not
// exist; exec mode (what the package documentation asks for behind a
// pooler) works. The same steps with both modes, so the setting is known
// to matter.
func TestQueryModeThroughATransactionPooler(t *testing.T) {
	bouncer := pgtest.PgBouncerURL(t)
	ctx := context.Background()
	for _, c := range []struct {
		mode     string
		wantFail bool
	}{{"cache_statement", true}, {"exec", false}} {
		t.Run(c.mode, func(t *testing.T) {
			// A database of its own: PgBouncer has no server connection to
			// it yet, so which one serves what is known.
			var b [4]byte
			_, _ = rand.Read(b[:])
			name := "t_pooler_" + hex.EncodeToString(b[:])
			if _, err := pgcluster.CreateDatabase(ctx, pgtest.URL(t), name); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if conn, err := pgx.Connect(context.Background(), pgtest.URL(t)); err == nil {
					_, _ = conn.Exec(context.Background(), "DROP DATABASE "+name+" WITH (FORCE)")
					conn.Close(context.Background())
				}
			})
			u, _ := neturl.Parse(bouncer)
			u.Path = "/" + name
			q := u.Query()
			q.Set("default_query_exec_mode", c.mode)
			u.RawQuery = q.Encode()
			p := open(t, u.String(), 3)
			a, err := p.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Release()
			var n int
			// A runs a statement: PgBouncer's first server connection serves it.
			if err := a.QueryRow(ctx, "SELECT $1::int + 1", 1).Scan(&n); err != nil {
				t.Fatalf("first run: %v", err)
			}
			// Two other clients hold transactions: the first takes that
			// server connection, the second a new one.
			for range 2 {
				other, err := p.Acquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer other.Release()
				tx, err := other.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback(ctx) //nolint:errcheck
				if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
					t.Fatal(err)
				}
			}
			// A runs it again, on a third server connection.
			err = a.QueryRow(ctx, "SELECT $1::int + 1", 2).Scan(&n)
			switch {
			case c.wantFail && err == nil:
				t.Fatalf("%s through PgBouncer in transaction mode worked; expected the prepared statement to be missing", c.mode)
			case c.wantFail:
				t.Logf("%s through PgBouncer: %v", c.mode, err)
				var pgErr *pgconn.PgError
				if !errors.As(err, &pgErr) || pgErr.Code != "26000" { // invalid_sql_statement_name
					t.Fatalf("err = %v, want SQLSTATE 26000 (prepared statement does not exist)", err)
				}
			case err != nil || n != 3:
				t.Fatalf("%s through PgBouncer: n = %d, %v", c.mode, n, err)
			}
		})
	}
}

// The same restart behind PgBouncer in transaction mode: while the
// database is away PgBouncer holds a query waiting for a server connection
// (up to its query_wait_timeout) or answers "server login has been failing"
// (08P01, retried); either way a transaction begun meanwhile starts once
// the database is back, within the caller's budget.
func TestDatabaseRestartBehindPgBouncer(t *testing.T) {
	pgtest.PgBouncerURL(t) // skips without PgBouncer, outside CI
	u, err := neturl.Parse(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	px := newProxy(t, u.Host)
	u.Host = px.addr
	dir, err := os.MkdirTemp("", "relaybus-pgbouncer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ctx := context.Background()
	b, err := pgbouncer.Start(ctx, pgbouncer.Options{ServerURL: u.String(), Dir: dir, ServerLoginRetry: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Stop(context.Background()) })
	p := open(t, b.URL, 2)
	if _, err := p.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	px.down()
	go func() {
		// The outage itself: longer than PgBouncer's server_login_retry, so
		// it has failed to log in at least once when the database returns.
		time.Sleep(3 * time.Second)
		px.up()
	}()
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	tx, err := p.Begin(cctx)
	if err != nil {
		t.Fatalf("begin across a restart behind PgBouncer (after %d retries): %v", p.Retries(), err)
	}
	var one int
	if err := tx.QueryRow(cctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("query in the new transaction: %v", err)
	}
	if err := tx.Commit(cctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d retries", p.Retries())
}
