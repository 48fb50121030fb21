package devstack

import (
	"context"
	"fmt"

	"github.com/relaybus/relaybus/functions/consume"
	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/functions/publish"
	relayfn "github.com/relaybus/relaybus/functions/relay"
	"github.com/relaybus/relaybus/functions/rollup"
	"github.com/relaybus/relaybus/internal/instance"
)

// The stack's own defaults, each written here once: Start falls back to
// them for a zero option, and make dev's flags show them.
const (
	// DefaultAddr is where the functions listen (Options.Addr, -addr).
	DefaultAddr = "127.0.0.1:8080"
	// DefaultStateDir holds the throwaway cluster and dev.json
	// (Options.StateDir, -state).
	DefaultStateDir = ".state"
	// DefaultProject is the project the emulators see when
	// GOOGLE_CLOUD_PROJECT is unset (Options.Project, -project).
	DefaultProject = "relaybus-local"
	// DefaultBackoffScale takes the topology's retry policies as they are
	// (Options.BackoffScale, -backoff-scale).
	DefaultBackoffScale = 1.0
)

// Functions are the five functions' configurations the stack builds them
// from: each the struct its cmd/main.go loads from the environment. Start
// sets over them only what is local (the services' addresses, the
// databases' URLs and pool sizes, the logger, no authentication, no rate
// limits, the local cadences; docs/local-stack.md lists them); everything
// else means and defaults to what it does in production.
type Functions struct {
	Publish publish.Config
	Relay   relayfn.Config
	// Consume is every consumer's base; the topology sets each
	// consumer's own (CONSUMER_*, FORWARD_URL, ...), as Terraform does.
	Consume   consume.Config
	Rollup    rollup.Config
	DLQReplay dlqreplay.Config
}

// DefaultFunctions are every function's defaults, as their env tags say
// (instance.Defaults): what Start builds from when Options.Functions is nil.
func DefaultFunctions() Functions {
	return Functions{
		Publish: instance.Defaults[publish.Config](), Relay: instance.Defaults[relayfn.Config](),
		Consume: instance.Defaults[consume.Config](), Rollup: instance.Defaults[rollup.Config](),
		DLQReplay: instance.Defaults[dlqreplay.Config](),
	}
}

// Config is what the local stack's commands (make dev, make demo, make
// load) read of the environment, read once by LoadConfig: the functions'
// own configurations, and the two variables of make dev's own.
type Config struct {
	// Functions are the functions' configurations, as each function
	// loads its own. Their DATABASE_URL, PUBSUB_EMULATOR_HOST,
	// FIRESTORE_EMULATOR_HOST, TRANSPORT, NATS_URL, GOOGLE_CLOUD_PROJECT and
	// RELAYBUS_TOPOLOGY are the stack's too (Options).
	Functions Functions
	// Addr is where the functions listen unless -addr says
	// (RELAYBUS_DEV_ADDR; empty: DefaultAddr).
	Addr string `env:"RELAYBUS_DEV_ADDR"`
	// PostgresBudget is the stack's Postgres connections unless -pg-budget
	// says (RELAYBUS_DEV_PG_BUDGET; 0: DefaultPostgresBudget).
	PostgresBudget int `env:"RELAYBUS_DEV_PG_BUDGET"`
}

// LoadConfig reads Config from the environment with the functions' own
// loader (instance.Load), so a variable has one default and an invalid
// value is an error naming it.
func LoadConfig(ctx context.Context) (Config, error) {
	own, err := instance.Load[struct {
		Addr           string `env:"RELAYBUS_DEV_ADDR"`
		PostgresBudget int    `env:"RELAYBUS_DEV_PG_BUDGET"`
	}](ctx)
	if err != nil {
		return Config{}, err
	}
	if own.PostgresBudget < 0 {
		return Config{}, fmt.Errorf("config: RELAYBUS_DEV_PG_BUDGET=%d: want a positive number of connections", own.PostgresBudget)
	}
	c := Config{Addr: own.Addr, PostgresBudget: own.PostgresBudget}
	if c.Functions.Publish, err = instance.Load[publish.Config](ctx); err != nil {
		return Config{}, err
	}
	if c.Functions.Relay, err = instance.Load[relayfn.Config](ctx); err != nil {
		return Config{}, err
	}
	if c.Functions.Consume, err = instance.Load[consume.Config](ctx); err != nil {
		return Config{}, err
	}
	if c.Functions.Rollup, err = instance.Load[rollup.Config](ctx); err != nil {
		return Config{}, err
	}
	if c.Functions.DLQReplay, err = instance.Load[dlqreplay.Config](ctx); err != nil {
		return Config{}, err
	}
	return c, nil
}

// Options are the stack's options the environment sets: the services to
// use instead of starting them, the topology, the broker, the project,
// make dev's address and budget, and the functions' configurations. The
// rest (and a flag given on the command line) the caller sets.
func (c Config) Options() Options {
	p := c.Functions.Publish // every function reads these variables alike
	fns := c.Functions
	return Options{
		Addr: c.Addr, PostgresBudget: c.PostgresBudget, Project: p.ProjectID,
		DatabaseURL: p.DB.URL, PubSubHost: p.PubSub.EmulatorHost, FirestoreHost: p.Ledger.EmulatorHost,
		Topology: p.Topology, Transport: p.PubSub.Transport, NATSURL: p.PubSub.NATSURL,
		Functions: &fns,
	}
}
