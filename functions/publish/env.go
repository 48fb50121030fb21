package publish

import (
	"context"
	"time"

	"github.com/relaybus/relaybus/shared/ledger/consumers"
	"github.com/relaybus/relaybus/shared/ledger/model"

	"github.com/GoogleCloudPlatform/functions-framework-go/functions"

	"github.com/relaybus/relaybus/shared/instance"
	"github.com/relaybus/relaybus/shared/ledger"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/registry"
	"github.com/relaybus/relaybus/shared/relay"
	"github.com/relaybus/relaybus/shared/schema"
	"github.com/relaybus/relaybus/shared/topology"
)

// The relay's and the registry's interfaces, met by the ledger's store and
// its consumer registry.
var (
	_ relay.Ledger      = (*ledger.Store)(nil)
	_ registry.Registry = (*consumers.Registry)(nil)
)

// Config is the publish function's configuration.
type Config struct {
	instance.Env
	PubSub instance.PubSub
	Ledger instance.Recorder
	// Relay is the fast path's relay tuning (RELAY_*).
	Relay relay.Config
	// DB is the outbox's database, the topology's main one (DATABASE_URL).
	DB instance.Database
	// MaxPayloadBytes is the payload limit (PUBLISH_MAX_PAYLOAD_BYTES, default 1 MiB).
	MaxPayloadBytes int `env:"PUBLISH_MAX_PAYLOAD_BYTES, default=1048576"`
	// FastPath publishes each accepted event at once (PUBLISH_FAST_PATH, default true).
	FastPath bool `env:"PUBLISH_FAST_PATH, default=true"`
	// Budget bounds one request (PUBLISH_BUDGET, default 2s).
	Budget time.Duration `env:"PUBLISH_BUDGET, default=2s"`
	// MaxInFlight bounds the requests served at once (PUBLISH_MAX_IN_FLIGHT, default 256).
	MaxInFlight int `env:"PUBLISH_MAX_IN_FLIGHT, default=256"`
	// RegistryTTL is how long a topic's enabled consumers, read from the
	// ledger's topic_consumers, are kept before they are read again
	// (REGISTRY_CACHE_TTL, default 30s: registry.DefaultCacheTTL).
	RegistryTTL time.Duration `env:"REGISTRY_CACHE_TTL, default=30s"`
	// Auth is cloudrun (behind Cloud Run IAM: the caller is read from the
	// ID token it verified, topics' publishers are enforced) or none
	// (PUBLISH_AUTH, default none).
	Auth string `env:"PUBLISH_AUTH, default=none"`
}

func init() {
	functions.HTTP("publish", instance.Lazy("publish", instance.FromEnv(instance.Load[Config], Build)))
}

// registryTimeout bounds a topic lookup in the ledger's topic_consumers
// before the topology file answers instead.
const registryTimeout = 500 * time.Millisecond

// Function is the publish handler built by Build, with what it must close
// at shutdown.
type Function struct {
	*Handler
	close instance.Closers
}

// Close flushes the fast path's ledger writes and closes the clients.
func (f *Function) Close(ctx context.Context) error { return f.close.Close(ctx) }

// Build is the publish function's one constructor, in production (from
// the environment), in the local stack and in tests: one outbox pool
// (migrated) for the handler and its fast path, the topic registry (the
// ledger's topic_consumers behind a cache that never makes a request wait
// after the start, with the topology file as its fallback, or the topology
// file alone when the ledger is off) and the relay's fast path.
func Build(ctx context.Context, cfg Config) (*Function, error) {
	log := cfg.Logger()
	top, err := topology.Load(cfg.Topology)
	if err != nil {
		return nil, err
	}
	schemas, err := schema.Load(top) // a schema that does not compile stops the start
	if err != nil {
		return nil, err
	}
	f := &Function{}
	fail := func(err error) (*Function, error) {
		_ = f.Close(context.Background())
		return nil, err
	}
	flush, err := cfg.StartTelemetry(ctx, "publish") // before the pool, which traces its statements
	if err != nil {
		return nil, err
	}
	f.close.Add(flush) // closed last: flushes the spans of everything else's shutdown
	pool, err := cfg.DB.Open(ctx, outbox.Migrations)
	if err != nil {
		return fail(err)
	}
	f.close.Add(func(context.Context) error { pool.Close(); return nil })
	opts := Options{DB: pool, MaxPayloadBytes: cfg.MaxPayloadBytes, Budget: cfg.Budget, MaxInFlight: cfg.MaxInFlight, Logger: log, Schemas: schemas, Topology: top}
	opts.Auth, opts.Publishers = cfg.Auth, map[string][]string{}
	for _, t := range top.Topics {
		opts.Publishers[t.Name] = t.PublisherEmails()
	}
	store, err := cfg.Ledger.Open(ctx, cfg.ProjectID, ledger.Options{Logger: log, Levels: model.LevelsOf(top)})
	if err != nil {
		return fail(err)
	}
	ro := cfg.Relay.Options()
	ro.DB, ro.Topology, ro.LedgerBudget, ro.Logger = pool, top, cfg.Ledger.Budget, log
	if store != nil {
		ro.Ledger = store
		f.close.Add(func(context.Context) error { return store.Close() })
		opts.Registry = registry.Cached(registry.WithFallback(consumers.New(store.Client(), consumers.Options{}), registry.FromTopology(top), registryTimeout), cfg.RegistryTTL)
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
		ps, err := cfg.PubSub.OpenBroker(ctx, cfg.ProjectID)
		if err != nil {
			return fail(err)
		}
		f.close.Add(func(context.Context) error { return ps.Close() })
		ro.Publisher = ps
		r, err := relay.New(ro)
		if err != nil {
			return fail(err)
		}
		f.close.Add(r.Close)
		opts.FastPath = r
	}
	h, err := New(opts)
	if err != nil {
		return fail(err)
	}
	f.Handler = h
	return f, nil
}
