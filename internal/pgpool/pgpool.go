// Package pgpool builds relaybus's Postgres connection pools, the one way
// every function (and the local stack) opens its database, and retries what
// a database that refuses or drops connections makes fail.
//
// # Pool size
//
// A pool holds at most pool_max_conns connections (a parameter of the URL,
// read by pgx); without it pgx's default is max(4, number of CPUs). A
// request that finds the pool full waits for a connection for as long as its
// context allows: it never fails because the pool is full.
//
// # Refused and lost connections
//
// Pool's Exec, Query, QueryRow and Begin retry, with exponential backoff and
// jitter, an error that happened before anything reached the server: a
// connection refused (the server is down or restarting), refused with
// SQLSTATE 53300 too_many_connections or 57P03 cannot_connect_now (starting
// up, shutting down, in recovery), reset during start-up, or a statement
// that could not be sent at all (pgconn.SafeToRetry). Nothing is retried
// that may have reached the server (a statement whose answer was lost): the
// caller decides that, since only it knows whether the statement is
// idempotent. Retries stop when the next wait would pass the context's
// deadline, so the caller still has time to answer (publish's 503, consume's
// nack) within its own budget; without a deadline they stop after
// RetryPolicy.MaxElapsed.
//
// # Transaction-mode poolers
//
// Behind PgBouncer in pool_mode=transaction, or Supabase's pooler on port
// 6543, consecutive transactions of one client connection may run on
// different server connections, so nothing may outlive a transaction:
// prepared statements, SET without LOCAL, session advisory locks, LISTEN.
// relaybus's hot paths keep no session state; what remains is pgx's default
// query mode, which prepares named statements and reuses them. Add
// default_query_exec_mode=exec to the pooler's URL (Open sets it by itself
// for a Supabase pooler URL on port 6543): each query is then parsed as an
// unnamed statement in the same round trip that runs it, with its
// parameters still sent apart from the SQL. It is preferred to
// simple_protocol (parameters interpolated into the SQL text by the client)
// and to cache_describe and describe_exec, which rely on a description
// obtained in an earlier round trip, possibly from another server connection.
//
// Migrations take a direct connection (Config.DirectURL): a pooler in
// transaction mode may not be where DDL should run, and the direct URL is
// what Supabase documents for them.
package pgpool

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relaybus/relaybus/internal/migrate"
	"github.com/relaybus/relaybus/internal/retry"
)

// RetryPolicy is how Pool retries refused and lost connections. The zero
// value means the defaults below.
type RetryPolicy struct {
	// MinBackoff is the first wait (DefaultMinBackoff); each retry doubles
	// it up to MaxBackoff, spread by ±20% jitter (retry.Policy).
	MinBackoff time.Duration
	// MaxBackoff caps one wait (DefaultMaxBackoff).
	MaxBackoff time.Duration
	// MaxElapsed bounds the retries of a call whose context has no deadline
	// (DefaultMaxElapsed). With a deadline, the deadline bounds them.
	MaxElapsed time.Duration
}

// Defaults of RetryPolicy.
const (
	DefaultMinBackoff = 25 * time.Millisecond
	DefaultMaxBackoff = time.Second
	DefaultMaxElapsed = 15 * time.Second
)

func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.MinBackoff <= 0 {
		p.MinBackoff = DefaultMinBackoff
	}
	if p.MaxBackoff <= 0 {
		p.MaxBackoff = DefaultMaxBackoff
	}
	if p.MaxBackoff < p.MinBackoff {
		p.MaxBackoff = p.MinBackoff
	}
	if p.MaxElapsed <= 0 {
		p.MaxElapsed = DefaultMaxElapsed
	}
	return p
}

// Config says which database to open and how.
type Config struct {
	// URL is the database the pool connects to (DATABASE_URL): a
	// postgres:// URL or a key=value string, with pgx's parameters
	// (pool_max_conns, default_query_exec_mode, ...).
	URL string
	// DirectURL, when set, is where migrations run (DATABASE_DIRECT_URL):
	// the database itself when URL points at a transaction-mode pooler.
	DirectURL string
	// Retry is the policy for refused and lost connections.
	Retry RetryPolicy
	// StartTimeout bounds Open's wait for the database to answer (10 s).
	StartTimeout time.Duration
	// Tracer, when set, traces the pool's statements (the functions pass
	// OpenTelemetry's when telemetry is on).
	Tracer pgx.QueryTracer
}

// DefaultStartTimeout bounds Open's wait for the database.
const DefaultStartTimeout = 10 * time.Second

// Pool is a pgx pool whose Exec, Query, QueryRow and Begin retry refused
// and lost connections (see the package documentation). The embedded
// *pgxpool.Pool gives everything else (Close, Stat, Acquire, ...), without
// retries.
type Pool struct {
	*pgxpool.Pool
	retry   RetryPolicy
	retries atomic.Int64
}

// DefaultConnectTimeout bounds one connection attempt when the URL sets no
// connect_timeout: pgx's own default is none, and a pool's connection
// attempts do not end with the caller that started them.
const DefaultConnectTimeout = 10 * time.Second

// cancelGrace is how long a statement whose context ended may take to
// answer the cancel request before its connection is closed.
const cancelGrace = 2 * time.Second

// ParseConfig parses url into a pgxpool configuration: pgx's own parsing,
// plus
//   - default_query_exec_mode=exec for a Supabase pooler URL in transaction
//     mode (port 6543) that does not choose a mode itself;
//   - DefaultConnectTimeout when the URL sets no connect_timeout;
//   - a statement whose context ends is cancelled in the server (a cancel
//     request) and its connection kept, once the server has answered
//     (within cancelGrace; else closed, as pgx does by default). pgx's
//     default closes the connection at once: after a timeout the pool opens
//     a new one, whose first statements pay for a new backend, its catalog
//     caches and their preparation, and the closed one keeps its pool slot
//     until its own cancel and close finish. Under a burst of timeouts
//     (the load that arrives as a database comes back) that churn made
//     every later statement time out too, and the pool never recovered
//     while the load lasted.
func ParseConfig(url string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	if !strings.Contains(url, "default_query_exec_mode") && cfg.ConnConfig.Port == 6543 &&
		strings.HasSuffix(cfg.ConnConfig.Host, ".pooler.supabase.com") {
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = DefaultConnectTimeout
	}
	cfg.ConnConfig.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: cancelGrace}
	}
	return cfg, nil
}

// New builds a pool from a parsed configuration without connecting (pgx
// connects on first use).
func New(ctx context.Context, cfg *pgxpool.Config, retry RetryPolicy) (*Pool, error) {
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return &Pool{Pool: p, retry: retry.withDefaults()}, nil
}

// Open builds the pool for c.URL, waits (retrying refused connections) up
// to c.StartTimeout for the database to answer, and applies the migration
// lines (each idempotent) over c.DirectURL when set, else over the pool, so
// an instance never serves against missing tables. Errors name the URL's
// variable, never the URL (it may hold a password).
func Open(ctx context.Context, c Config, lines ...migrate.Line) (*Pool, error) {
	if c.URL == "" {
		return nil, errors.New("DATABASE_URL is not set")
	}
	cfg, err := ParseConfig(c.URL)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	if c.Tracer != nil {
		cfg.ConnConfig.Tracer = c.Tracer
	}
	pool, err := New(ctx, cfg, c.Retry)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	if c.StartTimeout <= 0 {
		c.StartTimeout = DefaultStartTimeout
	}
	pingCtx, cancel := context.WithTimeout(ctx, c.StartTimeout)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres: %w", err)
	}
	if len(lines) == 0 {
		return pool, nil
	}
	var db migrate.Beginner = pool
	if c.DirectURL != "" {
		direct, err := pgx.ParseConfig(c.DirectURL)
		if err != nil {
			pool.Close()
			return nil, fmt.Errorf("DATABASE_DIRECT_URL: %w", err)
		}
		var conn *pgx.Conn
		err = pool.do(pingCtx, Lost, func() error {
			var err error
			conn, err = pgx.ConnectConfig(pingCtx, direct)
			return err
		})
		if err != nil {
			pool.Close()
			return nil, fmt.Errorf("postgres (direct URL, for migrations): %w", err)
		}
		defer conn.Close(context.WithoutCancel(ctx))
		db = conn
	}
	for _, l := range lines {
		if _, err := l.Apply(ctx, db); err != nil {
			pool.Close()
			return nil, err
		}
	}
	return pool, nil
}

// Retries is how many times the pool retried a call since it was built.
func (p *Pool) Retries() int64 { return p.retries.Load() }

// Ping checks that the database answers, retrying refused and lost
// connections.
func (p *Pool) Ping(ctx context.Context) error {
	return p.do(ctx, Lost, func() error { return p.Pool.Ping(ctx) })
}

// Exec runs sql on a pooled connection, retrying refused connections.
func (p *Pool) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	var tag pgconn.CommandTag
	err := p.do(ctx, Retryable, func() error {
		var err error
		tag, err = p.Pool.Exec(ctx, sql, args...)
		return err
	})
	return tag, err
}

// Query runs sql on a pooled connection, retrying refused connections
// (until the query is sent; errors reading its rows are the caller's).
func (p *Pool) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	var rows pgx.Rows
	err := p.do(ctx, Retryable, func() error {
		var err error
		rows, err = p.Pool.Query(ctx, sql, args...)
		if err != nil && rows != nil {
			rows.Close()
		}
		return err
	})
	return rows, err
}

// QueryRow is Query for at most one row (pgx.ErrNoRows when there is none).
func (p *Pool) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	rows, err := p.Query(ctx, sql, args...)
	return &row{rows: rows, err: err}
}

// Begin starts a transaction on a pooled connection, retrying refused
// connections.
func (p *Pool) Begin(ctx context.Context) (pgx.Tx, error) {
	return p.BeginTx(ctx, pgx.TxOptions{})
}

// BeginTx starts a transaction with options, retrying refused and lost
// connections (a BEGIN whose answer was lost left nothing behind: the
// server ends the transaction of a connection that is gone).
func (p *Pool) BeginTx(ctx context.Context, o pgx.TxOptions) (pgx.Tx, error) {
	var tx pgx.Tx
	err := p.do(ctx, Lost, func() error {
		var err error
		tx, err = p.Pool.BeginTx(ctx, o)
		return err
	})
	return tx, err
}

// row is pgx's one-row result over a retried Query.
type row struct {
	rows pgx.Rows
	err  error
}

func (r *row) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}

// do runs f, and again after a backoff while it fails with an error
// retryable accepts and the context leaves time for the wait. It returns
// f's last error.
func (p *Pool) do(ctx context.Context, retryable func(error) bool, f func() error) error {
	var stop time.Time
	if dl, ok := ctx.Deadline(); ok {
		stop = dl
	} else {
		stop = time.Now().Add(p.retry.MaxElapsed)
	}
	policy := retry.Policy{Initial: p.retry.MinBackoff, Max: p.retry.MaxBackoff}
	for n := 1; ; n++ {
		start := time.Now()
		err := f()
		if err == nil || !retryable(err) || ctx.Err() != nil {
			return err
		}
		// Jittered: callers refused together do not come back together.
		wait := policy.Delay(n)
		// Another attempt must end before the deadline, not only start:
		// allow it twice as long as this one took, so the caller gets the
		// error with its time to answer left, not a deadline exceeded.
		if time.Now().Add(wait + 2*time.Since(start)).After(stop) {
			return err
		}
		if retry.Sleep(ctx, wait) != nil {
			return err
		}
		p.retries.Add(1)
	}
}

// Retryable reports whether err happened before the statement reached the
// server, so running it again cannot apply it twice: SQLSTATE 53300
// too_many_connections or 57P03 cannot_connect_now, a connection attempt
// refused, reset or answered with a class 08 (connection exception) code
// (not a wrong password or an unknown database), PgBouncer's answer when it
// has no server connection to give (08P01 "server login has been
// failing", "pgbouncer cannot connect to server", query_wait_timeout), or
// an error pgconn marks safe to retry.
func Retryable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var pgErr *pgconn.PgError
	hasPgErr := errors.As(err, &pgErr)
	if hasPgErr && (pgErr.Code == "53300" || pgErr.Code == "57P03") {
		return true
	}
	if hasPgErr && pgErr.Code == "08P01" && pgbouncerNoServer(pgErr.Message) {
		return true
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		// The server answered the attempt with an error: only a refusal
		// is worth another try (a wrong password is not).
		if hasPgErr {
			return strings.HasPrefix(pgErr.Code, "08")
		}
		// No answer from the server: refused, reset, closed, timed out.
		var ne net.Error
		var oe *net.OpError
		return errors.As(err, &oe) || errors.As(err, &ne) || isEOF(err)
	}
	return pgconn.SafeToRetry(err)
}

// pgbouncerNoServer reports whether PgBouncer refused a statement because
// it had no server connection to run it on (the server down or refusing,
// or every server connection busy past query_wait_timeout): the statement
// never reached Postgres.
func pgbouncerNoServer(msg string) bool {
	for _, m := range []string{"server login has been failing", "pgbouncer cannot connect to server", "query_wait_timeout"} {
		if strings.Contains(msg, m) {
			return true
		}
	}
	return false
}

// Lost reports whether err is Retryable or the connection failed without
// the server answering (closed, reset, EOF): a statement that may have
// reached the server, so only one that leaves nothing behind (BEGIN, a
// ping) may run again.
func Lost(err error) bool {
	if Retryable(err) {
		return true
	}
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return strings.HasPrefix(pgErr.Code, "08") || pgErr.Code == "57P01" // admin_shutdown
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || isEOF(err)
}

func isEOF(err error) bool {
	s := err.Error()
	return strings.Contains(s, "EOF") || strings.Contains(s, "connection reset") || strings.Contains(s, "broken pipe")
}
