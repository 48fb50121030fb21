package publish

import (
	"context"
	"fmt"
	"net/http"

	"github.com/GoogleCloudPlatform/functions-framework-go/functions"
	"github.com/sethvargo/go-envconfig"

	"github.com/relaybus/relaybus/shared/instance"
	"github.com/relaybus/relaybus/shared/ledger"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/registry"
	"github.com/relaybus/relaybus/shared/relay"
	"github.com/relaybus/relaybus/shared/topology"
)

// Config is the function's environment: relay.Env (GOOGLE_CLOUD_PROJECT,
// LOG_LEVEL, RELAYBUS_TOPOLOGY, DATABASE_URL, LEDGER, FIRESTORE_DATABASE and
// the RELAY_* settings its fast path uses) and the settings below.
type Config struct {
	relay.Env
	// MaxPayloadBytes is the payload limit (PUBLISH_MAX_PAYLOAD_BYTES, 1 MiB).
	MaxPayloadBytes int `env:"PUBLISH_MAX_PAYLOAD_BYTES, default=1048576"`
	// FastPath publishes each accepted event at once (PUBLISH_FAST_PATH, true).
	FastPath bool `env:"PUBLISH_FAST_PATH, default=true"`
}

func init() {
	functions.HTTP("publish", instance.Lazy("publish", fromEnv))
}

// fromEnv builds the instance's handler: the outbox (migrated), the topic
// registry (the ledger's topic_consumers behind a cache, or the topology
// file when LEDGER=off) and the relay's fast path.
func fromEnv(ctx context.Context) (http.Handler, error) {
	var cfg Config
	if err := envconfig.Process(ctx, &cfg); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	log := cfg.Logger()
	pool, err := instance.Postgres(ctx, cfg.DatabaseURL, outbox.Migrations)
	if err != nil {
		return nil, err
	}
	opts := Options{DB: pool, MaxPayloadBytes: cfg.MaxPayloadBytes, Logger: log}
	store, err := ledger.OpenMode(ctx, cfg.Ledger, ledger.Config{ProjectID: cfg.ProjectID, Database: cfg.FirestoreDatabase}, ledger.Options{Logger: log})
	if err != nil {
		pool.Close()
		return nil, err
	}
	if store != nil {
		opts.Registry = registry.Cached(store, registry.DefaultCacheTTL)
	} else {
		top, err := topology.Load(cfg.Topology)
		if err != nil {
			pool.Close()
			return nil, err
		}
		opts.Registry = registry.FromTopology(top)
	}
	if cfg.FastPath {
		r, err := relay.Open(ctx, cfg.Env, log)
		if err != nil {
			pool.Close()
			return nil, err
		}
		opts.FastPath = r
	}
	return New(opts)
}
