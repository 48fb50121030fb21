// Package pgtest gives each test its own PostgreSQL schema on a real server,
// the way River's tests do: tests of the outbox, inbox, relay and consume
// paths run against Postgres, never a mock.
//
// The server is $RELAYBUS_TEST_DATABASE_URL when set (make test starts one
// cluster and sets it for every package); otherwise the first test that asks
// starts a throwaway cluster from the installed PostgreSQL binaries, which
// lives as long as the test binary. Call Main from TestMain to stop it.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	neturl "net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relaybus/relaybus/internal/pgcluster"
)

// EnvURL names the variable holding the test server's URL.
const EnvURL = "RELAYBUS_TEST_DATABASE_URL"

var (
	once     sync.Once
	url      string
	cluster  *pgcluster.Cluster
	tmpDir   string
	startErr error
)

// URL returns the test server's URL, starting a throwaway cluster if needed.
// A test that cannot get a server fails (it does not skip: a skipped database
// test is a test that did not run).
func URL(t testing.TB) string {
	t.Helper()
	once.Do(func() {
		if u := os.Getenv(EnvURL); u != "" {
			url = u
			return
		}
		dir, err := os.MkdirTemp("", "relaybus-pgtest-")
		if err != nil {
			startErr = err
			return
		}
		_ = os.Chmod(dir, 0o755) // the server may run as the postgres user
		tmpDir = dir
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cluster, startErr = pgcluster.Start(ctx, pgcluster.Options{DataDir: dir + "/data",
			Settings: map[string]string{"shared_preload_libraries": "pg_stat_statements"}})
		if startErr == nil {
			url = cluster.URL
		}
	})
	if startErr != nil {
		t.Fatalf("pgtest: no PostgreSQL for tests: %v", startErr)
	}
	return url
}

// Main runs the tests and then stops the cluster pgtest started, if any.
// Use it as: func TestMain(m *testing.M) { pgtest.Main(m) }. Packages that
// also use emulators call m.Run, pgtest.Cleanup and emutest.Cleanup themselves.
func Main(m *testing.M) {
	code := m.Run()
	Cleanup()
	os.Exit(code)
}

// Cleanup stops the cluster pgtest started, if any, and removes its files.
func Cleanup() {
	if cluster != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_ = cluster.Stop(ctx)
		cancel()
		cluster = nil
	}
	if tmpDir != "" {
		_ = os.RemoveAll(tmpDir)
		tmpDir = ""
	}
}

// Schema creates a fresh schema for the test and returns a pool whose
// connections use it as their search_path, so unqualified table names land
// there. The schema is dropped when the test ends.
func Schema(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool, _ := SchemaConfig(t, nil)
	return pool
}

// SchemaConfig is Schema with a hook to adjust the pool configuration (pool
// size, ...). It also returns the schema name.
func SchemaConfig(t testing.TB, adjust func(*pgxpool.Config)) (*pgxpool.Pool, string) {
	t.Helper()
	ctx := context.Background()
	base := URL(t)
	var b [4]byte
	_, _ = rand.Read(b[:])
	schema := "t_" + sanitize(t.Name()) + "_" + hex.EncodeToString(b[:])
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatalf("pgtest: connect: %v", err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatalf("pgtest: create schema: %v", err)
	}
	cfg, err := pgxpool.ParseConfig(base)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	if adjust != nil {
		adjust(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("pgtest: pool: %v", err)
	}
	t.Cleanup(func() {
		pool.Close()
		conn, err := pgx.Connect(context.Background(), base)
		if err != nil {
			return
		}
		defer conn.Close(context.Background())
		_, _ = conn.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	return pool, schema
}

// SchemaURL returns a connection URL whose search_path is schema, for code
// under test that opens its own connections.
func SchemaURL(t testing.TB, schema string) string {
	t.Helper()
	u := URL(t)
	sep := "?"
	if strings.Contains(u, "?") {
		sep = "&"
	}
	return u + sep + "search_path=" + schema
}

func sanitize(name string) string {
	var sb strings.Builder
	for _, r := range strings.ToLower(name) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			sb.WriteRune(r)
		default:
			sb.WriteByte('_')
		}
		if sb.Len() >= 40 {
			break
		}
	}
	return sb.String()
}

// RequireDurable fails the benchmark unless the test server commits as
// production does (fsync, synchronous_commit and full_page_writes on), and
// returns those settings for the benchmark's comment line: a figure taken
// on a non-durable server does not count (../shared/BENCH.md), so it is not
// printed at all. make bench starts a durable server (testenv -durable).
func RequireDurable(tb testing.TB) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	settings, durable, err := pgcluster.Durability(ctx, URL(tb))
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	if !durable {
		tb.Fatalf("pgtest: the benchmark's Postgres is not durable (%s): its figures would not count; run it through make bench (testenv -durable)", settings)
	}
	return settings
}

// Database creates a database of its own for t (dropped when t ends) and
// returns its URL: for tests that read the server's per-database
// statistics (pg_stat_database), which other tests' schemas in the shared
// database would add to.
func Database(t testing.TB) string {
	t.Helper()
	ctx := context.Background()
	base := URL(t)
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := "t_" + sanitize(t.Name()) + "_" + hex.EncodeToString(b[:])
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatalf("pgtest: connect: %v", err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("pgtest: create database: %v", err)
	}
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), base)
		if err != nil {
			return
		}
		defer conn.Close(context.Background())
		_, _ = conn.Exec(context.Background(), "DROP DATABASE "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	})
	u, err := neturl.Parse(base)
	if err != nil || u.Scheme == "" {
		t.Fatalf("pgtest: the test server's URL %q is not a postgres:// URL", base)
	}
	u.Path = "/" + name
	return u.String()
}
