package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/relaybus/relaybus/shared/instance"
	"github.com/relaybus/relaybus/shared/ledger"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/postgres"
	"github.com/relaybus/relaybus/shared/topology"
	"github.com/relaybus/relaybus/shared/transport"
)

// Config is the relay's tuning from the environment
// (github.com/sethvargo/go-envconfig), as the relay function and publish's
// fast path read it.
type Config struct {
	// TimeBudget bounds one scheduled drain (RELAY_TIME_BUDGET, 45s); keep
	// it under the Scheduler job's attempt deadline.
	TimeBudget time.Duration `env:"RELAY_TIME_BUDGET, default=45s"`
	// BatchSize is the most rows one claim takes (RELAY_BATCH_SIZE, 1000).
	BatchSize int `env:"RELAY_BATCH_SIZE, default=1000"`
	// Aggregates is the most aggregates one claim leases (RELAY_AGGREGATES, 1000).
	Aggregates int `env:"RELAY_AGGREGATES, default=1000"`
	// RunLimit is the most rows of one aggregate per claim (RELAY_RUN_LIMIT, 500).
	RunLimit int `env:"RELAY_RUN_LIMIT, default=500"`
	// Concurrency is how many claim/publish/settle workers a drain runs
	// (RELAY_CONCURRENCY, 4).
	Concurrency int `env:"RELAY_CONCURRENCY, default=4"`
	// Lease is how long a claim holds its aggregates (RELAY_LEASE, 20s):
	// long enough for one claim's publishes, short enough that a relay that
	// died leaves its aggregates waiting only that long.
	Lease time.Duration `env:"RELAY_LEASE, default=20s"`
	// MaxAttempts failed publishes make an aggregate FAILED (RELAY_MAX_ATTEMPTS, 5).
	MaxAttempts int `env:"RELAY_MAX_ATTEMPTS, default=5"`
	// BackoffBase and BackoffMax shape the retry delays (RELAY_BACKOFF_BASE
	// 10s, RELAY_BACKOFF_MAX 10m).
	BackoffBase time.Duration `env:"RELAY_BACKOFF_BASE, default=10s"`
	BackoffMax  time.Duration `env:"RELAY_BACKOFF_MAX, default=10m"`
	// Retention is how long published rows are kept (OUTBOX_RETENTION, 24h).
	Retention time.Duration `env:"OUTBOX_RETENTION, default=24h"`
	// LedgerBudget bounds one batch of ledger writes (LEDGER_BUDGET, 10s).
	LedgerBudget time.Duration `env:"LEDGER_BUDGET, default=10s"`
	// HealDelay is how long the live ledger recorder has before the healing
	// step records a send (RELAY_HEAL_DELAY, 30s).
	HealDelay time.Duration `env:"RELAY_HEAL_DELAY, default=30s"`
}

// Options returns the options of a relay with this configuration over the
// given clients (ledger may be nil: no ledger).
func (c Config) Options(db DB, pub Publisher, top *topology.Topology, led Ledger, log *slog.Logger) Options {
	o := Options{DB: db, Publisher: pub, Topology: top, Logger: log,
		BatchSize: c.BatchSize, Aggregates: c.Aggregates, RunLimit: c.RunLimit, Concurrency: c.Concurrency,
		Lease: c.Lease, MaxAttempts: c.MaxAttempts, BackoffBase: c.BackoffBase, BackoffMax: c.BackoffMax,
		Retention: c.Retention, LedgerBudget: c.LedgerBudget, HealDelay: c.HealDelay}
	if led != nil {
		o.Ledger = led
	}
	return o
}

// Env is everything the relay function reads from the environment: the
// shared settings, the relay's Config, the outbox databases and the ledger.
type Env struct {
	instance.Env
	Config
	// Databases are the names of the outbox databases to drain
	// (RELAY_DATABASES, "main"): the topology's databases. The URL of each
	// is in its topology.Database.EnvVar(): DATABASE_URL for main,
	// DATABASE_URL_<NAME> for the others.
	Databases []string `env:"RELAY_DATABASES, default=main"`
	// DatabaseURL is main's URL (DATABASE_URL).
	DatabaseURL string `env:"DATABASE_URL"`
	// DatabaseDirectURL, when set, is where main's migrations run
	// (DATABASE_DIRECT_URL; the others' in DATABASE_DIRECT_URL_<NAME>):
	// the database itself when the URL is a transaction-mode pooler.
	DatabaseDirectURL string `env:"DATABASE_DIRECT_URL"`
	// Ledger is firestore or off (LEDGER, firestore).
	Ledger string `env:"LEDGER, default=firestore"`
	// FirestoreDatabase is the ledger's database id (FIRESTORE_DATABASE).
	FirestoreDatabase string `env:"FIRESTORE_DATABASE, default=(default)"`
	// LedgerRetention is how long ledger documents are kept (LEDGER_RETENTION, 720h).
	LedgerRetention time.Duration `env:"LEDGER_RETENTION, default=720h"`
}

// Set is one relay per outbox database, sharing one Pub/Sub client and one
// ledger.
type Set struct {
	// Relays by database name, and the names in the order configured.
	Relays map[string]*Relay
	Names  []string
	close  []func(context.Context) error
}

// Close closes every relay (flushing its ledger writes), then the clients.
func (s *Set) Close(ctx context.Context) error {
	var errs []error
	for i := len(s.close) - 1; i >= 0; i-- {
		errs = append(errs, s.close[i](ctx))
	}
	return errors.Join(errs...)
}

// Open builds a relay for every database of env.Databases: its pool
// (migrated), one Pub/Sub client (the emulator when PUBSUB_EMULATOR_HOST
// is set), the topology and, unless env.Ledger is "off", the Firestore
// ledger. The relay function uses it.
func Open(ctx context.Context, env Env, log *slog.Logger) (*Set, error) {
	top, err := topology.Load(env.Topology)
	if err != nil {
		return nil, err
	}
	s := &Set{Relays: map[string]*Relay{}}
	fail := func(err error) (*Set, error) {
		_ = s.Close(context.Background())
		return nil, err
	}
	ps, err := transport.New(ctx, env.ProjectID, transport.Options{})
	if err != nil {
		return nil, err
	}
	s.close = append(s.close, func(context.Context) error { return ps.Close() })
	store, err := ledger.OpenMode(ctx, env.Ledger, ledger.Config{ProjectID: env.ProjectID, Database: env.FirestoreDatabase},
		ledger.Options{Logger: log, Retention: env.LedgerRetention})
	if err != nil {
		return fail(err)
	}
	var led Ledger
	if store != nil {
		led = store
		s.close = append(s.close, func(context.Context) error { return store.Close() })
	}
	for _, name := range env.Databases {
		name = strings.TrimSpace(name)
		db, ok := top.Database(name)
		if !ok {
			return fail(fmt.Errorf("RELAY_DATABASES: %q is not a database of the topology", name))
		}
		url := os.Getenv(db.EnvVar())
		if name == topology.MainDatabase && env.DatabaseURL != "" {
			url = env.DatabaseURL
		}
		if url == "" {
			return fail(fmt.Errorf("database %s: %s is not set", name, db.EnvVar()))
		}
		direct := os.Getenv(db.DirectEnvVar())
		if name == topology.MainDatabase && env.DatabaseDirectURL != "" {
			direct = env.DatabaseDirectURL
		}
		pool, err := postgres.Open(ctx, postgres.Config{URL: url, DirectURL: direct}, outbox.Migrations)
		if err != nil {
			return fail(fmt.Errorf("database %s: %w", name, err))
		}
		s.close = append(s.close, func(context.Context) error { pool.Close(); return nil })
		r, err := New(env.Config.Options(pool, ps, top, led, log.With("database", name)))
		if err != nil {
			return fail(err)
		}
		s.close = append(s.close, r.Close)
		s.Relays[name] = r
		s.Names = append(s.Names, name)
	}
	return s, nil
}
