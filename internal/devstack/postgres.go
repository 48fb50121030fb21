package devstack

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relaybus/relaybus/functions/consume"
	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/internal/pgcluster"
	"github.com/relaybus/relaybus/internal/pgpool"
	"github.com/relaybus/relaybus/shared/topology"
)

// postgresServer is the Postgres the stack runs on: DATABASE_URL's, or a
// cluster it started.
type postgresServer struct {
	// URL is main's database.
	URL string
	// Started says what was started ("" when DATABASE_URL named a server).
	Started string
}

// startPostgres starts a throwaway cluster under <StateDir>/postgres
// unless databaseURL names a running server.
func startPostgres(ctx context.Context, databaseURL, stateDir string, durable bool, down *teardown) (postgresServer, error) {
	if databaseURL != "" {
		return postgresServer{URL: databaseURL}, nil
	}
	dir, err := filepath.Abs(filepath.Join(stateDir, "postgres"))
	if err != nil {
		return postgresServer{}, fmt.Errorf("postgres: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return postgresServer{}, fmt.Errorf("postgres: %w", err)
	}
	c, err := pgcluster.Start(ctx, pgcluster.Options{DataDir: dir, Durable: durable})
	if err != nil {
		return postgresServer{}, fmt.Errorf("postgres: %w", err)
	}
	down.push(func(ctx context.Context) { _ = c.Stop(ctx) })
	return postgresServer{URL: c.URL, Started: fmt.Sprintf("PostgreSQL  %s (data in %s)", c.URL, dir)}, nil
}

// databases is the Postgres step's result: every topology database
// created and migrated, and the stack's own pool of each.
type databases struct {
	// URLs are every topology database's URL by name, main's included.
	URLs map[string]string
	// Names are the topology's databases, in its order.
	Names []string
	// Pools are the stack's own pools (roleAdmin), one per database.
	Pools map[string]*pgxpool.Pool
	// shares is each pool role's size (poolShares).
	shares map[poolRole]int
}

// url is database db's URL for a function's pool of role: its share of
// the budget as pool_max_conns.
func (d databases) url(db string, role poolRole) string {
	// Every URL was read by withPoolMaxConns when its admin pool was made
	// (openDatabases): none fails here.
	u, _ := withPoolMaxConns(d.URLs[db], d.shares[role])
	return u
}

// poolSize is the size of a function's pool of role.
func (d databases) poolSize(role poolRole) int { return d.shares[role] }

// others are the URLs of the databases other than main, for role.
func (d databases) others(role poolRole) map[string]string {
	m := map[string]string{}
	for name := range d.URLs {
		if name != topology.MainDatabase {
			m[name] = d.url(name, role)
		}
	}
	return m
}

// openDatabases finds or creates every database the topology declares on
// mainURL's server (databaseBeside), applies every migration and opens the
// stack's own pool of each; the functions open pools of their own from
// databases.url, each its role's share of budget.
func openDatabases(ctx context.Context, mainURL string, budget int, top *topology.Topology, down *teardown) (databases, error) {
	consumers := 1 // the forwarders service (forward consumers added at run time)
	for _, c := range top.Consumers() {
		if c.IsEnabled() {
			consumers++
		}
	}
	shares, err := poolShares(budget, len(top.Databases), consumers)
	if err != nil {
		return databases{}, err
	}
	d := databases{URLs: map[string]string{}, Pools: map[string]*pgxpool.Pool{}, shares: shares}
	for _, db := range top.Databases {
		pool, url, err := openDatabase(ctx, mainURL, db, shares[roleAdmin], down)
		if err != nil {
			return databases{}, fmt.Errorf("database %s: %w", db.Name, err)
		}
		d.URLs[db.Name], d.Pools[db.Name] = url, pool
		d.Names = append(d.Names, db.Name)
	}
	return d, nil
}

// openDatabase is db's URL, migrated, and a pool of size on it.
func openDatabase(ctx context.Context, mainURL string, db topology.Database, size int, down *teardown) (*pgxpool.Pool, string, error) {
	url := mainURL
	if db.Name != topology.MainDatabase {
		var err error
		if url, err = databaseBeside(ctx, mainURL, db); err != nil {
			return nil, "", err
		}
	}
	adminURL, err := withPoolMaxConns(url, size)
	if err != nil {
		return nil, "", err
	}
	cfg, err := pgpool.ParseConfig(adminURL)
	if err != nil {
		return nil, "", err
	}
	pool, err := pgpool.New(ctx, cfg, pgpool.RetryPolicy{})
	if err != nil {
		return nil, "", err
	}
	down.push(func(context.Context) { pool.Close() })
	if err := consume.Migrate(ctx, pool); err != nil {
		return nil, "", fmt.Errorf("migrations: %w", err)
	}
	return pool.Pool, url, nil
}

// databaseBeside returns the URL of db's database on the same server as
// mainURL: $DATABASE_URL_<NAME> when set, else the main database's name
// followed by _<name>, created when missing.
func databaseBeside(ctx context.Context, mainURL string, db topology.Database) (string, error) {
	if u := instance.DatabaseURLs([]string{db.Name})[db.Name]; u != "" {
		return u, nil
	}
	cfg, err := pgx.ParseConfig(mainURL)
	if err != nil {
		return "", err
	}
	name := cfg.Database + "_" + strings.ReplaceAll(db.Name, "-", "_")
	if u, err := url.Parse(mainURL); err != nil || u.Scheme == "" {
		return "", fmt.Errorf("DATABASE_URL must be a postgres:// URL to derive %s from it (or set %s)", name, db.EnvVar())
	}
	beside, err := pgcluster.CreateDatabase(ctx, mainURL, name)
	if err != nil {
		return "", fmt.Errorf("%w (or set %s)", err, db.EnvVar())
	}
	// The main URL's search_path (a schema of its own, as the tests use) is
	// made in the new database too.
	if schema := cfg.RuntimeParams["search_path"]; schema != "" {
		c2, err := pgx.Connect(ctx, beside)
		if err != nil {
			cfg2, _ := pgx.ParseConfig(beside)
			delete(cfg2.RuntimeParams, "search_path")
			if c2, err = pgx.ConnectConfig(ctx, cfg2); err != nil {
				return "", err
			}
		}
		defer c2.Close(ctx)
		if _, err := c2.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize()); err != nil {
			return "", fmt.Errorf("schema %s in %s: %w", schema, name, err)
		}
	}
	return beside, nil
}
