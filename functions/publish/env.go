package publish

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/GoogleCloudPlatform/functions-framework-go/functions"
	"github.com/sethvargo/go-envconfig"

	"github.com/relaybus/relaybus/shared/instance"
	"github.com/relaybus/relaybus/shared/ledger"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/postgres"
	"github.com/relaybus/relaybus/shared/registry"
	"github.com/relaybus/relaybus/shared/relay"
	"github.com/relaybus/relaybus/shared/topology"
	"github.com/relaybus/relaybus/shared/transport"
)

// Config is the function's environment: the shared settings
// (GOOGLE_CLOUD_PROJECT, LOG_LEVEL, RELAYBUS_TOPOLOGY), the relay's
// settings its fast path uses (RELAY_*, LEDGER_BUDGET), and the settings
// below.
type Config struct {
	instance.Env
	relay.Config
	// DatabaseURL is the outbox's Postgres, the topology's main database
	// (DATABASE_URL).
	DatabaseURL string `env:"DATABASE_URL"`
	// DatabaseDirectURL, when set, is where migrations run
	// (DATABASE_DIRECT_URL): the database itself when DATABASE_URL is a
	// transaction-mode pooler.
	DatabaseDirectURL string `env:"DATABASE_DIRECT_URL"`
	// Ledger is firestore or off (LEDGER, firestore).
	Ledger string `env:"LEDGER, default=firestore"`
	// FirestoreDatabase is the ledger's database id (FIRESTORE_DATABASE).
	FirestoreDatabase string `env:"FIRESTORE_DATABASE, default=(default)"`
	// LedgerRetention is how long ledger documents are kept (LEDGER_RETENTION, 720h).
	LedgerRetention time.Duration `env:"LEDGER_RETENTION, default=720h"`
	// MaxPayloadBytes is the payload limit (PUBLISH_MAX_PAYLOAD_BYTES, 1 MiB).
	MaxPayloadBytes int `env:"PUBLISH_MAX_PAYLOAD_BYTES, default=1048576"`
	// FastPath publishes each accepted event at once (PUBLISH_FAST_PATH, true).
	FastPath bool `env:"PUBLISH_FAST_PATH, default=true"`
	// Budget bounds one request (PUBLISH_BUDGET, 2s).
	Budget time.Duration `env:"PUBLISH_BUDGET, default=2s"`
	// MaxInFlight bounds the requests served at once (PUBLISH_MAX_IN_FLIGHT, 256).
	MaxInFlight int `env:"PUBLISH_MAX_IN_FLIGHT, default=256"`
}

func init() {
	functions.HTTP("publish", instance.Lazy("publish", fromEnv))
}

// registryTimeout bounds a topic lookup in the ledger's topic_consumers
// before the topology file answers instead.
const registryTimeout = 500 * time.Millisecond

// Function is the publish handler built from the environment, with what it
// must close at shutdown.
type Function struct {
	*Handler
	close []func(context.Context) error
}

// Close flushes the fast path's ledger writes and closes the clients.
func (f *Function) Close(ctx context.Context) error {
	var errs []error
	for i := len(f.close) - 1; i >= 0; i-- {
		errs = append(errs, f.close[i](ctx))
	}
	return errors.Join(errs...)
}

// fromEnv builds the instance's handler: one outbox pool (migrated) for the
// handler and its fast path, the topic registry (the ledger's
// topic_consumers behind a cache that never makes a request wait after the
// start, with the topology file as its fallback, or the topology file alone
// when LEDGER=off) and the relay's fast path.
func fromEnv(ctx context.Context) (http.Handler, error) {
	var cfg Config
	if err := envconfig.Process(ctx, &cfg); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	log := cfg.Logger()
	top, err := topology.Load(cfg.Topology)
	if err != nil {
		return nil, err
	}
	f := &Function{}
	fail := func(err error) (http.Handler, error) {
		_ = f.Close(context.Background())
		return nil, err
	}
	pool, err := postgres.Open(ctx, postgres.Config{URL: cfg.DatabaseURL, DirectURL: cfg.DatabaseDirectURL}, outbox.Migrations)
	if err != nil {
		return nil, err
	}
	f.close = append(f.close, func(context.Context) error { pool.Close(); return nil })
	opts := Options{DB: pool, MaxPayloadBytes: cfg.MaxPayloadBytes, Budget: cfg.Budget, MaxInFlight: cfg.MaxInFlight, Logger: log}
	store, err := ledger.OpenMode(ctx, cfg.Ledger, ledger.Config{ProjectID: cfg.ProjectID, Database: cfg.FirestoreDatabase},
		ledger.Options{Logger: log, Retention: cfg.LedgerRetention})
	if err != nil {
		return fail(err)
	}
	var led relay.Ledger
	if store != nil {
		led = store
		f.close = append(f.close, func(context.Context) error { return store.Close() })
		opts.Registry = registry.Cached(registry.WithFallback(store, registry.FromTopology(top), registryTimeout), registry.DefaultCacheTTL)
		var topics []string
		for _, t := range top.Topics {
			topics = append(topics, t.Name)
		}
		if err := registry.Warm(ctx, opts.Registry, topics...); err != nil {
			log.WarnContext(ctx, "publish: cannot warm the topic registry", "error", err.Error())
		}
	} else {
		opts.Registry = registry.FromTopology(top)
	}
	if cfg.FastPath {
		ps, err := transport.New(ctx, cfg.ProjectID, transport.Options{})
		if err != nil {
			return fail(err)
		}
		f.close = append(f.close, func(context.Context) error { return ps.Close() })
		r, err := relay.New(cfg.Config.Options(pool, ps, top, led, log))
		if err != nil {
			return fail(err)
		}
		f.close = append(f.close, r.Close)
		opts.FastPath = r
	}
	h, err := New(opts)
	if err != nil {
		return fail(err)
	}
	f.Handler = h
	return f, nil
}
