// Package pgtest gives each test its own PostgreSQL schema on a real server,
// the way River's tests do: tests of the outbox, inbox, relay and consume
// paths run against Postgres, never a mock.
//
// The server is $RELAYBUS_TEST_DATABASE_URL when set (make test starts one
// cluster and sets it for every package); otherwise the first test that asks
// starts a throwaway cluster from the installed PostgreSQL binaries, which
// lives as long as the test binary. Call Main from TestMain to stop it.
//
// With RELAYBUS_TEST_VIA_PGBOUNCER=1, Schema, SchemaConfig and SchemaURL hand
// out connections through PgBouncer in transaction mode
// (RELAYBUS_TEST_PGBOUNCER_URL, started by the test environment) with pgx's
// exec query mode, as a user behind Supabase's pooler runs relaybus, so a
// package's whole suite runs through a pooler unchanged. PgBouncer 1.18
// (Debian 12) refuses a search_path start-up parameter, so in that mode
// each test gets a database of its own instead of a schema (named as the
// schema would be, with a schema of that name as its search_path, and
// dropped when the test ends).
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

	"github.com/relaybus/relaybus/internal/pgbouncer"
	"github.com/relaybus/relaybus/internal/pgcluster"
)

// EnvURL names the variable holding the test server's URL.
const EnvURL = "RELAYBUS_TEST_DATABASE_URL"

// EnvPooled names the variable that routes Schema, SchemaConfig and
// SchemaURL through PgBouncer ("1").
const EnvPooled = "RELAYBUS_TEST_VIA_PGBOUNCER"

// PgBouncerURL returns the URL of PgBouncer in transaction mode in front of
// the test server (pgbouncer.EnvURL, with default_query_exec_mode=exec).
// Without one the test is skipped, saying why, unless CI=true: there a
// missing PgBouncer fails the test, as any missing dependency does.
func PgBouncerURL(t testing.TB) string {
	t.Helper()
	u := os.Getenv(pgbouncer.EnvURL)
	if u == "" {
		msg := "pgtest: no PgBouncer (" + pgbouncer.EnvURL + " is not set): run the tests under go run ./internal/cmd/testenv with pgbouncer installed (Debian: apt-get install pgbouncer)"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return u
}

func pooled() bool { return os.Getenv(EnvPooled) == "1" }

// pooledURL is PgBouncer's URL to database db.
func pooledURL(t testing.TB, db string) string {
	t.Helper()
	u, err := neturl.Parse(PgBouncerURL(t))
	if err != nil {
		t.Fatalf("pgtest: %s: %v", pgbouncer.EnvURL, err)
	}
	u.Path = "/" + db
	return u.String()
}

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
		// Tests of a package run in parallel, each with pools of its own.
		cluster, startErr = pgcluster.Start(ctx, pgcluster.Options{DataDir: dir + "/data",
			Settings: map[string]string{"max_connections": "200", "shared_preload_libraries": "pg_stat_statements"}})
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
	base := URL(t)
	if pooled() {
		return pooledDatabase(t, base, uniqueName(t, "t"), adjust)
	}
	return SchemaOn(t, base, "t", adjust)
}

// uniqueName is prefix_<test name>_<random>, a name of t's own.
func uniqueName(t testing.TB, prefix string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return prefix + "_" + sanitize(t.Name()) + "_" + hex.EncodeToString(b[:])
}

// SchemaOn creates a schema named prefix_<test name>_<random> in the
// database at url and returns a pool whose connections use it as their
// search_path (adjust, when set, changes the pool's configuration first),
// and the schema's name. The schema is dropped when the test ends.
func SchemaOn(t testing.TB, url, prefix string, adjust func(*pgxpool.Config)) (*pgxpool.Pool, string) {
	t.Helper()
	ctx := context.Background()
	schema := uniqueName(t, prefix)
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("pgtest: connect: %v", err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatalf("pgtest: create schema: %v", err)
	}
	cfg, err := pgxpool.ParseConfig(url)
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
		conn, err := pgx.Connect(context.Background(), url)
		if err != nil {
			return
		}
		defer conn.Close(context.Background())
		_, _ = conn.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	return pool, schema
}

// pooledDatabase is SchemaConfig through PgBouncer: a database named name,
// dropped when the test ends.
func pooledDatabase(t testing.TB, base, name string, adjust func(*pgxpool.Config)) (*pgxpool.Pool, string) {
	t.Helper()
	ctx := context.Background()
	url := pooledURL(t, name)
	direct, err := pgcluster.CreateDatabase(ctx, base, name)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	// A schema of the same name as the database's default search_path (a
	// setting of the database, which every server connection starts with),
	// so current_schema() names the test's database as it names its schema
	// outside PgBouncer.
	conn, err := pgx.Connect(ctx, direct)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	id := pgx.Identifier{name}.Sanitize()
	_, err = conn.Exec(ctx, "CREATE SCHEMA "+id+"; ALTER DATABASE "+id+" SET search_path = "+id)
	conn.Close(ctx)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
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
		// FORCE: PgBouncer keeps its server connections to the database.
		_, _ = conn.Exec(context.Background(), "DROP DATABASE "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	})
	return pool, name
}

// SchemaURL returns a connection URL whose search_path is schema, for code
// under test that opens its own connections (through PgBouncer, to the
// test's database, when RELAYBUS_TEST_VIA_PGBOUNCER=1).
func SchemaURL(t testing.TB, schema string) string {
	t.Helper()
	if pooled() {
		return pooledURL(t, schema)
	}
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
// on a non-durable server does not count (docs/benchmarks.md), so it is not
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

// NoAutovacuum turns autovacuum off for every table now in the database
// at url (a Database's), for tests that count its transactions in
// pg_stat_database: an autovacuum worker that visits the database mid-run
// (an ANALYZE of each table the test filled) commits transactions of its
// own there. Call it after the tables are created. The system catalogs
// cannot be kept from autovacuum that way, and creating the tables
// filled them with dead rows: it vacuums and analyzes the database
// (catalogs included) once, so that no worker comes for them mid-run.
func NoAutovacuum(t testing.TB, url string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("pgtest: connect: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `DO $$
		DECLARE r record;
		BEGIN
			FOR r IN SELECT c.oid::regclass AS t FROM pg_class c
			         WHERE c.relkind = 'r' AND c.relpersistence = 'p'
			           AND c.relnamespace NOT IN ('pg_catalog'::regnamespace, 'information_schema'::regnamespace) LOOP
				EXECUTE format('ALTER TABLE %s SET (autovacuum_enabled = false)', r.t);
			END LOOP;
		END $$`); err != nil {
		t.Fatalf("pgtest: autovacuum off: %v", err)
	}
	if _, err := conn.Exec(ctx, `VACUUM (ANALYZE)`); err != nil {
		t.Fatalf("pgtest: vacuum the catalogs: %v", err)
	}
}
