package publish

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/relaybus/relaybus/internal/privacy/topologyrules"

	"github.com/relaybus/relaybus/internal/ledger/consumers"
	"github.com/relaybus/relaybus/internal/ledger/model"

	"github.com/GoogleCloudPlatform/functions-framework-go/functions"

	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/internal/instance/brokeropen"
	"github.com/relaybus/relaybus/internal/instance/claimopen"
	"github.com/relaybus/relaybus/internal/instance/fsopen"
	"github.com/relaybus/relaybus/internal/instance/pgopen"
	"github.com/relaybus/relaybus/internal/ledger"
	"github.com/relaybus/relaybus/internal/names"
	"github.com/relaybus/relaybus/internal/registry"
	"github.com/relaybus/relaybus/internal/schema"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/relay"
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
	// ClaimCheck is where messages over its threshold go (CLAIM_CHECK_*;
	// none when unset); with one, PUBLISH_MAX_PAYLOAD_BYTES may be up to
	// 32 MiB (event.MaxClaimCheckPayload).
	ClaimCheck instance.ClaimCheck
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
	// (PUBLISH_AUTH; empty: cloudrun on Cloud Run, none elsewhere).
	Auth string `env:"PUBLISH_AUTH"`
	// Audiences are the audiences a caller's ID token may have
	// (PUBLISH_AUDIENCE, comma-separated: the service's URLs; empty checks
	// none).
	Audiences []string `env:"PUBLISH_AUDIENCE"`
	// Publishers adds publishers to the topology's, per topic
	// (PUBLISH_PUBLISHERS, a JSON object: {"shop.order.events":
	// ["order-service@p.iam.gserviceaccount.com"]}): the identities a
	// deployment knows and a shared topology file cannot name.
	Publishers string `env:"PUBLISH_PUBLISHERS"`
	// RateLimit and RateBurst bound each caller's requests per second on
	// one instance (PUBLISH_RATE_LIMIT, default 200, 0 for no limit;
	// PUBLISH_RATE_BURST, default 400); past them, 429 with Retry-After.
	RateLimit float64 `env:"PUBLISH_RATE_LIMIT, default=200"`
	RateBurst int     `env:"PUBLISH_RATE_BURST, default=400"`
}

// ParsePublishers reads PUBLISH_PUBLISHERS: a JSON object from topic to
// the emails that may publish to it.
func ParsePublishers(s string) (map[string][]string, error) {
	out := map[string][]string{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	if err := json.Unmarshal([]byte(s), &out); err != nil {
		return nil, fmt.Errorf("PUBLISH_PUBLISHERS: want a JSON object from topic to a list of emails: %w", err)
	}
	for topic, ps := range out {
		if err := names.ValidateTopic(topic); err != nil {
			return nil, fmt.Errorf("PUBLISH_PUBLISHERS: %w", err)
		}
		for _, p := range ps {
			email := strings.TrimPrefix(strings.TrimPrefix(p, "serviceAccount:"), "user:")
			if !strings.Contains(email, "@") || strings.ContainsAny(email, ": ,") {
				return nil, fmt.Errorf("PUBLISH_PUBLISHERS: %s: %q: want an email (a serviceAccount: or user: prefix is fine); a group cannot be checked against an ID token", topic, p)
			}
		}
	}
	return out, nil
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
	pool, err := pgopen.Open(ctx, cfg.DB, outbox.Migrations)
	if err != nil {
		return fail(err)
	}
	f.close.Add(func(context.Context) error { pool.Close(); return nil })
	opts := Options{DB: pool, MaxPayloadBytes: cfg.MaxPayloadBytes, Budget: cfg.Budget, MaxInFlight: cfg.MaxInFlight, Logger: log, Schemas: schemas, Topology: top}
	claims, closeClaims, err := claimopen.Open(ctx, cfg.ClaimCheck)
	if err != nil {
		return fail(err)
	}
	f.close.Add(func(context.Context) error { return closeClaims() })
	opts.ClaimCheck = claims != nil
	opts.Publishers, err = ParsePublishers(cfg.Publishers)
	if err != nil {
		return fail(err)
	}
	for _, t := range top.Topics {
		opts.Publishers[t.Name] = append(opts.Publishers[t.Name], t.PublisherEmails()...)
	}
	opts.Auth, opts.Audiences, opts.OnCloudRun = cfg.Auth, cfg.Audiences, cfg.OnCloudRun()
	if opts.Auth == "" {
		opts.Auth = AuthNone
		if opts.OnCloudRun {
			opts.Auth = AuthCloudRun
		}
	}
	if opts.Auth == AuthNone && opts.OnCloudRun {
		log.WarnContext(ctx, "publish: PUBLISH_AUTH=none on Cloud Run: every caller Cloud Run admits may publish to every topic; set PUBLISH_AUTH=cloudrun to enforce each topic's publishers")
	}
	opts.RateLimit, opts.RateBurst = cfg.RateLimit, cfg.RateBurst
	if opts.RateLimit == 0 {
		opts.RateLimit = -1 // PUBLISH_RATE_LIMIT=0: no limit
	}
	store, err := fsopen.Recorder(ctx, cfg.Ledger, cfg.ProjectID, ledger.Options{Logger: log, Levels: model.LevelsOf(top), Privacy: topologyrules.Of(top)})
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
		ps, err := brokeropen.Open(ctx, cfg.PubSub, cfg.ProjectID)
		if err != nil {
			return fail(err)
		}
		f.close.Add(func(context.Context) error { return ps.Close() })
		ro.Publisher = ps
		if claims != nil {
			ro.Claims = claims
		}
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
