package devstack

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/relaybus/relaybus/functions/consume"
	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/functions/publish"
	relayfn "github.com/relaybus/relaybus/functions/relay"
	"github.com/relaybus/relaybus/functions/rollup"
	"github.com/relaybus/relaybus/internal/forwarders"
	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/shared/relay"
	"github.com/relaybus/relaybus/shared/topology"
)

// functionsInput is what the functions step builds the five functions
// from: their configurations as loaded (Functions), and what the stack
// sets over them, values only (the emulators, the databases, the local
// cadences), never the code path: each function is built by its own
// Build, as its cmd/main.go builds it on Cloud Run.
type functionsInput struct {
	// Base is the stack's URL.
	Base string
	// Functions are the configurations to start from.
	Functions Functions
	// Env is every function's: the project, the topology and the
	// stack's logger.
	Env instance.Env
	// Broker is how the functions reach the broker.
	Broker instance.PubSub
	// Ledger is the Firestore ledger (the emulator, the local reconcile
	// delay).
	Ledger instance.Ledger
	// HealDelay, when set, is the relays' RELAY_HEAL_DELAY.
	HealDelay time.Duration
	// DBs are the databases, each function's pool sized by its role.
	DBs databases
	// Topology declares the consumers.
	Topology *topology.Topology
	// Pushes: the broker has push (brokerClient.Pushes); without, every
	// consumer pulls its own subscription.
	Pushes bool
	// Pauser pauses and resumes pushed consumers for the operations API
	// (the delivery loop; nil without push).
	Pauser dlqreplay.Pauser
	// Forwarders creates and deletes the forwarders' subscriptions and
	// routes the delivery loop to them (nil without push).
	Forwarders *Forwarders
}

// functions is the functions step's result: every function mounted under
// its prefix, and the consumers' URLs the delivery and the scheduler
// need.
type functions struct {
	Mux *http.ServeMux
	// Consumers are the enabled consumers, each with its URL.
	Consumers []mountedConsumer
}

// mountedConsumer is a consumer of the topology and where it is served.
type mountedConsumer struct {
	topology.Consumer
	// URL is its prefix on the stack (no trailing slash).
	URL string
}

// buildFunctions builds every function by its own Build and mounts it on
// one mux; each is closed (its ledger writes flushed) by down.
func buildFunctions(ctx context.Context, in functionsInput, down *teardown) (functions, error) {
	fns := functions{Mux: http.NewServeMux()}
	fns.Mux.Handle("/", notFound{})
	add := func(name, prefix string, h http.Handler, err error) error {
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if c, ok := h.(instance.Closer); ok {
			down.push(func(ctx context.Context) { _ = c.Close(ctx) })
		}
		mount(fns.Mux, prefix, h)
		return nil
	}
	pub, err := publish.Build(ctx, publishConfig(in))
	if err := add("publish", "/publish", pub, err); err != nil {
		return functions{}, err
	}
	rel, err := relayfn.Build(ctx, relayConfig(in))
	if err := add("relay", "/relay", rel, err); err != nil {
		return functions{}, err
	}
	rol, err := rollup.Build(ctx, rollupConfig(in))
	if err := add("rollup", "/rollup", rol, err); err != nil {
		return functions{}, err
	}
	for _, c := range in.Topology.Consumers() {
		if !c.IsEnabled() {
			continue
		}
		path := "/consume/" + c.Subscription()
		h, err := consume.Build(ctx, consumerConfig(in, c))
		if err := add("consumer "+c.Subscription(), path, h, err); err != nil {
			return functions{}, err
		}
		fns.Consumers = append(fns.Consumers, mountedConsumer{Consumer: c, URL: in.Base + path})
	}
	// The key the operations API seals hmac forwarders' secrets under and
	// the forwarders service opens them with: the one the environment sets
	// (RELAYBUS_FORWARDERS_KEY), else one made for this run: an hmac
	// forwarder an earlier run added on a kept database then does not open
	// (its deliveries answer 503 and the log says why); set the variable to
	// keep them across runs.
	key := cmp.Or(in.Functions.DLQReplay.ForwardersKey, in.Functions.Consume.ForwardersKey, forwarders.NewKey())
	in.Functions.DLQReplay.ForwardersKey, in.Functions.Consume.ForwardersKey = key, key
	// The forwarders service: every forward consumer added at run time
	// (POST /dlqreplay/forwarders), each under its name; its subscriptions
	// are created by the operations API and delivered by the loop
	// (Forwarders), or, on NATS, pulled by the service itself.
	h, err := consume.Build(ctx, forwardersConfig(in))
	if err := add("forwarders", forwardersPath, h, err); err != nil {
		return functions{}, err
	}
	ops, err := dlqreplay.Build(ctx, dlqreplayConfig(in))
	if err := add("dlqreplay", "/dlqreplay", ops, err); err != nil {
		return functions{}, err
	}
	return fns, nil
}

// recorder is the ledger recording of publish and the relay: as loaded,
// on the stack's ledger.
func (in functionsInput) recorder(r instance.Recorder) instance.Recorder {
	r.Ledger = in.Ledger
	return r
}

// relay is the relays' tuning (the relay's and publish's fast path): the
// topology's time budget, and a backoff of 1 s..30 s, shorter than
// production's for a developer waiting on a retry.
func (in functionsInput) relay(r relay.Config) relay.Config {
	r.TimeBudget = time.Duration(in.Topology.Relay.TimeBudgetSeconds) * time.Second
	r.BackoffBase, r.BackoffMax = time.Second, 30*time.Second
	if in.HealDelay > 0 {
		r.HealDelay = in.HealDelay
	}
	return r
}

func publishConfig(in functionsInput) publish.Config {
	c := in.Functions.Publish
	c.Env, c.PubSub, c.Ledger, c.Relay = in.Env, in.Broker, in.recorder(c.Ledger), in.relay(c.Relay)
	c.DB.URL = in.DBs.url(topology.MainDatabase, rolePublish)
	// A topic_consumers change shows within seconds (30 s in production).
	c.RegistryTTL = 5 * time.Second
	// Every local caller is 127.0.0.1 (no identity without Cloud Run):
	// one bucket for the demo, the load generator and the user would be
	// no per-caller limit at all.
	c.RateLimit = 0
	return c
}

func relayConfig(in functionsInput) relayfn.Config {
	c := in.Functions.Relay
	c.Env, c.PubSub, c.Ledger, c.Relay = in.Env, in.Broker, in.recorder(c.Ledger), in.relay(c.Relay)
	c.Databases, c.DB.URL, c.DatabaseURLs = in.DBs.Names, in.DBs.url(topology.MainDatabase, roleRelay), in.DBs.others(roleRelay)
	return c
}

func rollupConfig(in functionsInput) rollup.Config {
	c := in.Functions.Rollup
	c.Env, c.Ledger = in.Env, in.Ledger
	return c
}

// consumerConfig is what Terraform sets for a topology consumer's consume
// service (infra/terraform/run.tf, consume_env), over consume's
// configuration as loaded (FORWARD_SIGNING_SECRET signs a forward
// consumer's requests; forward_secret names a Secret Manager secret in
// production).
func consumerConfig(in functionsInput, c topology.Consumer) consume.Config {
	cc := in.Functions.Consume
	cc.ConsumerID, cc.Subscription, cc.Handler = c.Service, c.Subscription(), c.Handler
	cc.MaxDeliveryAttempts, cc.RollupTopic = c.MaxDeliveryAttempts, in.Topology.Rollup.Topic
	cc.ForwardURL, cc.ForwardAudience = c.ForwardURL, c.ForwardAudience
	if c.ForwardAuth != "" {
		cc.ForwardAuth = c.ForwardAuth
	}
	if c.ForwardTimeoutSeconds > 0 {
		cc.ForwardTimeout = time.Duration(c.ForwardTimeoutSeconds) * time.Second
	}
	if c.ForwardBreakerThreshold != 0 {
		cc.ForwardBreakerThreshold = c.ForwardBreakerThreshold
	}
	if c.ForwardBreakerCoolDownSeconds > 0 {
		cc.ForwardBreakerCoolDown = time.Duration(c.ForwardBreakerCoolDownSeconds) * time.Second
	}
	if c.ForwardBreakerMaxCoolDownSeconds > 0 {
		cc.ForwardBreakerMaxCoolDown = time.Duration(c.ForwardBreakerMaxCoolDownSeconds) * time.Second
	}
	cc.ForwardProbe = c.ForwardProbe
	if c.GapTimeoutSeconds > 0 {
		cc.GapTimeout = time.Duration(c.GapTimeoutSeconds) * time.Second
	}
	if c.ForwardSecret == "" {
		cc.ForwardSigningSecret = ""
	}
	// Flow control: one local process per consumer takes the whole rate.
	cc.MaxInFlight, cc.MaxPerSecond = c.MaxInFlight, c.MaxPerSecond
	cc.Env, cc.PubSub = in.Env, in.Broker
	cc.DB.URL = in.DBs.url(c.Database, roleConsumer)
	if !in.Pushes {
		// No push: the consumer pulls its durable consumer itself, as in
		// production, within its pool's share.
		cc.Mode, cc.PullMaxInFlight = consume.ModePull, in.DBs.poolSize(roleConsumer)
	}
	return cc
}

func dlqreplayConfig(in functionsInput) dlqreplay.Config {
	c := in.Functions.DLQReplay
	c.Env, c.PubSub, c.Ledger = in.Env, in.Broker, in.Ledger
	c.DB.URL, c.DatabaseURLs = in.DBs.url(topology.MainDatabase, roleOps), in.DBs.others(roleOps)
	// No auth locally (Cloud Run's IAM in production): the caller is
	// "anonymous", named here as the stack's one operator (an admin of
	// everything) and as the DLQ monitors' archiver, since every list is
	// closed when empty. One caller for everything: no rate limit.
	c.Auth = dlqreplay.AuthNone
	c.Writers = []string{dlqreplay.Anonymous}
	c.Archivers = []string{dlqreplay.Anonymous}
	c.RateLimit = 0
	c.Pauser = in.Pauser
	if in.Pushes && in.Forwarders != nil {
		c.ForwardersURL = in.Base + forwardersPath
		// The loop dead-letters by the route's max attempts (pstest's
		// dead-lettering is broken).
		c.ForwardersNoDeadLetterPolicy = true
		c.ForwarderSubscriptions = in.Forwarders
	}
	if !in.Pushes {
		// On NATS the API creates each forwarder's durable consumer and
		// the forwarders service pulls it (the URL says it runs).
		c.ForwardersURL = in.Base + forwardersPath
	}
	return c
}

// forwardersPath is where the local stack serves the forwarders service.
const forwardersPath = "/consume/forwarders"

// forwardersConfig is the forwarders service's configuration: a consume
// service serving every forwarder of the main database's registry.
func forwardersConfig(in functionsInput) consume.Config {
	cc := in.Functions.Consume
	cc.ConsumerID, cc.Subscription, cc.Handler = "forwarders", "", consume.HandlerForwarders
	cc.RollupTopic = in.Topology.Rollup.Topic
	cc.ForwardURL, cc.ForwardAudience, cc.ForwardSigningSecret = "", "", ""
	cc.Env, cc.PubSub = in.Env, in.Broker
	cc.DB.URL = in.DBs.url(topology.MainDatabase, roleConsumer)
	if !in.Pushes {
		// No push: it pulls each forwarder's durable consumer, one worker
		// each, within its pool's share.
		cc.Mode, cc.PullMaxInFlight = consume.ModePull, in.DBs.poolSize(roleConsumer)
	}
	return cc
}

func mount(mux *http.ServeMux, prefix string, h http.Handler) {
	mux.Handle(prefix+"/", http.StripPrefix(prefix, h))
	mux.Handle(prefix, h)
}
