// Package devstack runs the whole of relaybus on one machine, as `make dev`
// does: Postgres (DATABASE_URL, or a throwaway cluster under .state/), with
// one database per database the topology declares (main is DATABASE_URL's;
// the others are created beside it, <name>_<database>, unless
// DATABASE_URL_<NAME> names one), Pub/Sub (PUBSUB_EMULATOR_HOST, or
// in-process pstest), Firestore (FIRESTORE_EMULATOR_HOST, or the gcloud
// emulator), the topics, subscriptions and topic_consumers registry from
// infra/topology.yaml, the functions on one address, a delivery loop
// standing in for Eventarc and push, and a scheduler standing in for Cloud
// Scheduler's jobs.
//
// Paths on the one address: /publish, /relay (?database=<name>),
// /consume/<subscription-id> (one per consumer in the topology, each with
// its /ledger:ship and /inbox:purge), /rollup (/reconcile, /expire),
// /dlqreplay/... (the operations API, no auth locally; the DLQ monitor
// subscriptions deliver to its archive).
package devstack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	ledgerconsumers "github.com/relaybus/relaybus/internal/ledger/consumers"
	"github.com/relaybus/relaybus/internal/ledger/model"

	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relaybus/relaybus/functions/consume"
	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/functions/publish"
	relayfn "github.com/relaybus/relaybus/functions/relay"
	"github.com/relaybus/relaybus/functions/rollup"
	"github.com/relaybus/relaybus/internal/emulator"
	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/internal/instance/brokeropen"
	"github.com/relaybus/relaybus/internal/instance/fsopen"
	"github.com/relaybus/relaybus/internal/ledger"
	"github.com/relaybus/relaybus/internal/names"
	"github.com/relaybus/relaybus/internal/pgcluster"
	"github.com/relaybus/relaybus/internal/pgpool"
	"github.com/relaybus/relaybus/internal/pstestserver"
	"github.com/relaybus/relaybus/internal/registry"
	"github.com/relaybus/relaybus/internal/topology"
	"github.com/relaybus/relaybus/shared/broker"
	"github.com/relaybus/relaybus/shared/broker/nats"
	"github.com/relaybus/relaybus/shared/broker/pubsub"

	_ "github.com/relaybus/relaybus/examples/shop" // the demo topology's handlers
)

// Options configure Start. The zero value runs everything locally.
type Options struct {
	// Addr is where the functions listen (127.0.0.1:8080).
	Addr string
	// StateDir holds the throwaway Postgres cluster and the stack's info
	// file (.state).
	StateDir string
	// Project is the Google Cloud project the emulators see (relaybus-local).
	Project string
	// DatabaseURL, PubSubHost and FirestoreHost use running services instead
	// of starting them (DATABASE_URL, PUBSUB_EMULATOR_HOST,
	// FIRESTORE_EMULATOR_HOST).
	DatabaseURL, PubSubHost, FirestoreHost string
	// Topology is the topology file ("" finds infra/topology.yaml).
	Topology string
	// Transport is the broker: pubsub (the default) or nats (TRANSPORT):
	// NATS JetStream, on the server at NATSURL (NATS_URL) or on one
	// embedded in the stack, storing under <StateDir>/nats (see nats.go).
	Transport, NATSURL string
	// DurablePostgres starts the stack's own cluster with fsync,
	// synchronous_commit and full_page_writes on, as in production (off by
	// default: a developer's stack trades an OS crash's durability for
	// speed; a SIGKILL of the stack loses nothing either way). Benchmarks
	// set it.
	DurablePostgres bool
	// RelayEvery is the local scheduler's cadence for POST /relay (2s; Cloud
	// Scheduler runs every minute; child events are kicked at once anyway).
	RelayEvery time.Duration
	// LedgerEvery is the cadence of the ledger's catch-up jobs: every
	// consumer's POST /ledger:ship and rollup's POST /reconcile (10s; every
	// minute in production).
	LedgerEvery time.Duration
	// PurgeEvery is the cadence of every consumer's POST /inbox:purge (1h;
	// daily in production).
	PurgeEvery time.Duration
	// ExpireEvery is the local scheduler's cadence for POST /rollup/expire
	// (1h, as in production).
	ExpireEvery time.Duration
	// BackoffScale multiplies the subscriptions' retry backoff in the
	// delivery loop (1: the topology's retry policy as Terraform gives it
	// to Pub/Sub, 10 s..600 s by default, so a database outage costs the
	// same delivery attempts locally as in production; 0.05 makes it
	// 0.5 s..30 s, for a demo in a hurry).
	BackoffScale float64
	// PostgresBudget is the most Postgres connections the stack holds at
	// once, all its pools together (DefaultPostgresBudget, 40). As in
	// production, where each function is a Cloud Run service with pools of
	// its own, publish, each database's relay, each consumer and dlqreplay
	// have their own pools, so a flood of deliveries cannot starve publish
	// of connections; the stack keeps one more per database (Pools) for its
	// scheduler and tests. Each pool's share (see poolShares) is the
	// pool_max_conns of the URL its function gets; a request that finds its
	// pool full waits for a connection.
	PostgresBudget int
	// ReconcileAfter is how long the ledger waits before the reconciler
	// looks at an event that is not settled (15 s: with the reconciler
	// every LedgerEvery, an event whose rollup was lost in a crash is
	// final within half a minute; production waits
	// ledger.DefaultReconcileAfter, a minute, for its once-a-minute job).
	ReconcileAfter time.Duration
	// ForwardSigningSecret signs the forward consumers' requests (those
	// whose topology entry names a forward_secret): consume's
	// FORWARD_SIGNING_SECRET, which make dev loads with consume's Config.
	ForwardSigningSecret string
	// HealDelay is how long the relays' live ledger recorder has before
	// their healing step records a send (relay.DefaultHealDelay).
	HealDelay time.Duration
	// Logger receives the stack's and the functions' logs.
	Logger *slog.Logger
	// Drained, when set, is called by Close once the server has answered
	// its last request and the delivery loop has stopped, before any
	// function closes its pools: where a host flushes its telemetry, so
	// the gauges that read the pools are exported (make dev).
	Drained func(ctx context.Context)
}

// Info is what a running stack tells its clients (the demo): it is written
// to <StateDir>/dev.json.
type Info struct {
	URL         string `json:"url"`
	DatabaseURL string `json:"databaseUrl"`
	// Databases are the URLs of every topology database, main included.
	Databases     map[string]string `json:"databases"`
	FirestoreHost string            `json:"firestoreHost"`
	PubSubHost    string            `json:"pubsubHost"`
	Project       string            `json:"project"`
	// Transport and NATSURL: the broker, as Options say (nats: the
	// server's URL).
	Transport string `json:"transport,omitempty"`
	NATSURL   string `json:"natsUrl,omitempty"`
	// ConsumersPull: the broker has no push (no broker.PushConfigurer:
	// NATS JetStream), so every consumer pulls its own subscription.
	ConsumersPull bool `json:"consumersPull,omitempty"`
}

// Stack is a running local stack.
type Stack struct {
	// Info says where everything is.
	Info Info
	// Started lists, one line each, what the stack started and where.
	Started []string
	// Ledger, Pool (main's), Pools (every database's), PubSub and Topology
	// are the stack's own clients; the functions have theirs, built by
	// each function's Build from its configuration as in production.
	Ledger   *ledger.Store
	Pool     *pgxpool.Pool
	Pools    map[string]*pgxpool.Pool
	PubSub   *pubsub.Client
	Topology *topology.Topology
	// Broker is the stack's own client of its transport: PubSub, or a
	// *nats.Client with Transport nats (PubSub is nil then).
	Broker broker.Broker
	// Delivery is what the delivery loop handed back to Pub/Sub when it
	// stopped (set by Close once the loop stopped within its context).
	Delivery Stopped
	delivery Stopped

	server  *http.Server
	cancel  context.CancelFunc
	done    chan struct{}
	closers []func(context.Context)
	infoAt  string
	drained func(ctx context.Context)
}

// Check reports every prerequisite Start would miss, one error per line,
// each saying what to install (nil when nothing is missing): the
// PostgreSQL server binaries unless DatabaseURL is set, and Java, the
// gcloud SDK and its Firestore emulator unless FirestoreHost is set.
// Pub/Sub needs nothing: pstest runs in process.
func Check(o Options) error {
	var missing []error
	if o.DatabaseURL == "" {
		if _, err := pgcluster.BinDir(); err != nil {
			missing = append(missing, pgcluster.ErrNoBinaries)
		}
	}
	if o.FirestoreHost == "" {
		if _, err := exec.LookPath("java"); err != nil {
			missing = append(missing, fmt.Errorf("%w; or set FIRESTORE_EMULATOR_HOST to a running Firestore emulator", emulator.ErrNoJava))
		}
		if _, err := emulator.SDKRoot(); err != nil {
			missing = append(missing, fmt.Errorf("%w; or set FIRESTORE_EMULATOR_HOST to a running Firestore emulator", err))
		} else if err := emulator.Check(emulator.Firestore); errors.Is(err, emulator.ErrNoFirestore) {
			missing = append(missing, err)
		}
	}
	return errors.Join(missing...)
}

// Start starts everything and returns once the stack serves. A missing
// prerequisite fails it before anything starts (see Check); so does a busy
// address.
func Start(ctx context.Context, o Options) (s *Stack, err error) {
	if o.Addr == "" {
		o.Addr = "127.0.0.1:8080"
	}
	if o.StateDir == "" {
		o.StateDir = ".state"
	}
	if o.Project == "" {
		o.Project = "relaybus-local"
	}
	if o.RelayEvery <= 0 {
		o.RelayEvery = 2 * time.Second
	}
	if o.LedgerEvery <= 0 {
		o.LedgerEvery = 10 * time.Second
	}
	if o.ReconcileAfter <= 0 {
		o.ReconcileAfter = 15 * time.Second
	}
	if o.PurgeEvery <= 0 {
		o.PurgeEvery = time.Hour
	}
	if o.ExpireEvery <= 0 {
		o.ExpireEvery = time.Hour
	}
	if o.BackoffScale <= 0 {
		o.BackoffScale = 1
	}
	if o.PostgresBudget <= 0 {
		o.PostgresBudget = DefaultPostgresBudget
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	// onNATS chooses the local server and the client the stack connects
	// (an embedded JetStream server or pstest, below); what the stack does
	// differently afterwards is asked of the broker (pushes).
	onNATS := o.Transport == instance.TransportNATS
	if o.Transport != "" && o.Transport != instance.TransportPubSub && !onNATS {
		return nil, fmt.Errorf("TRANSPORT=%q: want %s or %s", o.Transport, instance.TransportPubSub, instance.TransportNATS)
	}
	if err := Check(o); err != nil {
		return nil, err
	}
	s = &Stack{done: make(chan struct{}), drained: o.Drained}
	started := s // the named result is nil by the time a failure's defer runs
	defer func() {
		if err != nil {
			started.Close(context.Background())
		}
	}()
	ln, err := net.Listen("tcp", o.Addr)
	if err != nil {
		return nil, fmt.Errorf("cannot listen on %s (is something else using the port? set -addr): %w", o.Addr, err)
	}
	s.closers = append(s.closers, func(context.Context) { ln.Close() })
	top, err := topology.Load(o.Topology)
	if err != nil {
		return nil, err
	}
	s.Topology = top

	// The services, at once: Postgres and the Firestore emulator take a
	// second or two each to start.
	var (
		wg           sync.WaitGroup
		mu           sync.Mutex
		pgErr, fsErr error
	)
	closeLater := func(f func(context.Context)) {
		mu.Lock()
		s.closers = append(s.closers, f)
		mu.Unlock()
	}
	if o.DatabaseURL == "" {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dir, _ := filepath.Abs(filepath.Join(o.StateDir, "postgres"))
			if pgErr = os.MkdirAll(filepath.Dir(dir), 0o755); pgErr != nil {
				return
			}
			c, err := pgcluster.Start(ctx, pgcluster.Options{DataDir: dir, Durable: o.DurablePostgres})
			if err != nil {
				pgErr = fmt.Errorf("postgres: %w", err)
				return
			}
			closeLater(func(ctx context.Context) { _ = c.Stop(ctx) })
			o.DatabaseURL = c.URL
			mu.Lock()
			s.Started = append(s.Started, fmt.Sprintf("PostgreSQL  %s (data in %s)", c.URL, dir))
			mu.Unlock()
		}()
	}
	if o.FirestoreHost == "" {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := emulator.Start(ctx, emulator.Firestore, emulator.Options{})
			if err != nil {
				fsErr = fmt.Errorf("firestore emulator: %w", err)
				return
			}
			closeLater(func(context.Context) { p.Stop() })
			o.FirestoreHost = p.Host
			mu.Lock()
			s.Started = append(s.Started, "Firestore   emulator on "+p.Host)
			mu.Unlock()
		}()
	}
	var wake *Wakeup // pstest tells the delivery loop about each publish
	if onNATS && o.NATSURL == "" {
		ns, err := startNATS(filepath.Join(o.StateDir, "nats"))
		if err != nil {
			return nil, err
		}
		closeLater(func(context.Context) { ns.Shutdown(); ns.WaitForShutdown() })
		o.NATSURL = ns.ClientURL()
		mu.Lock()
		s.Started = append(s.Started, "NATS        embedded JetStream server on "+o.NATSURL+" (store in "+filepath.Join(o.StateDir, "nats")+")")
		mu.Unlock()
	}
	if o.PubSubHost == "" && !onNATS {
		wake = NewWakeup()
		// pstest behind the front internal/cmd/pstest serves too
		// (pstestserver: its seek guard), with the loop's wake-up.
		srv, err := pstestserver.Start("127.0.0.1:0", pstestserver.Options{Reactors: []pstest.ServerReactorOption{wake.Reactor()}})
		if err != nil {
			return nil, fmt.Errorf("pstest: %w", err)
		}
		closeLater(func(ctx context.Context) {
			ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			_ = srv.Shutdown(ctx)
		})
		o.PubSubHost = srv.Addr
		mu.Lock()
		s.Started = append(s.Started, "Pub/Sub     in-process pstest on "+srv.Addr)
		mu.Unlock()
	}
	wg.Wait()
	if err := errors.Join(pgErr, fsErr); err != nil {
		return nil, err
	}

	// Postgres: every database's URL, every migration applied, and one pool
	// per database for the scheduler and tests (Pools). Each function opens
	// pools of its own from its URL (fnURL), each the size its role's share
	// of Options.PostgresBudget gives the URL's pool_max_conns.
	urls := map[string]string{}
	consumers := 0
	for _, c := range top.Consumers() {
		if c.IsEnabled() {
			consumers++
		}
	}
	shares, err := poolShares(o.PostgresBudget, len(top.Databases), consumers)
	if err != nil {
		return nil, err
	}
	// Every URL was read by withPoolMaxConns when its admin pool was made
	// (below): fnURL cannot meet one it fails on.
	fnURL := func(db string, role poolRole) string {
		u, _ := withPoolMaxConns(urls[db], shares[role])
		return u
	}
	s.Pools = map[string]*pgxpool.Pool{}
	var dbNames []string
	for _, db := range top.Databases {
		url := o.DatabaseURL
		if db.Name != topology.MainDatabase {
			if url, err = databaseBeside(ctx, o.DatabaseURL, db); err != nil {
				return nil, fmt.Errorf("database %s: %w", db.Name, err)
			}
		}
		urls[db.Name] = url
		dbNames = append(dbNames, db.Name)
		adminURL, err := withPoolMaxConns(url, shares[roleAdmin])
		if err != nil {
			return nil, fmt.Errorf("database %s: %w", db.Name, err)
		}
		cfg, err := pgpool.ParseConfig(adminURL)
		if err != nil {
			return nil, fmt.Errorf("database %s: %w", db.Name, err)
		}
		pool, err := pgpool.New(ctx, cfg, pgpool.RetryPolicy{})
		if err != nil {
			return nil, fmt.Errorf("database %s: %w", db.Name, err)
		}
		s.closers = append(s.closers, func(context.Context) { pool.Close() })
		if err := consume.Migrate(ctx, pool); err != nil {
			return nil, fmt.Errorf("database %s: migrations: %w", db.Name, err)
		}
		s.Pools[db.Name] = pool.Pool
	}
	s.Pool = s.Pools[topology.MainDatabase]
	// The other databases' URLs for the relay and for dlqreplay.
	relayOthers, opsOthers := map[string]string{}, map[string]string{}
	for name := range urls {
		if name != topology.MainDatabase {
			relayOthers[name], opsOthers[name] = fnURL(name, roleRelay), fnURL(name, roleOps)
		}
	}

	// The configuration every function shares: what differs from
	// production is only values (the emulators, the local cadences), never
	// the code path: each function below is built by its own Build, as its
	// cmd/main.go builds it on Cloud Run.
	env := instance.Defaults[instance.Env]()
	env.ProjectID, env.Topology, env.LogHandler = o.Project, o.Topology, o.Logger.Handler()
	pubsubCfg := instance.PubSub{EmulatorHost: o.PubSubHost, Transport: instance.TransportPubSub}
	if onNATS {
		pubsubCfg = instance.PubSub{Transport: instance.TransportNATS, NATSURL: o.NATSURL}
	}
	ledgerCfg := instance.Defaults[instance.Ledger]()
	ledgerCfg.EmulatorHost, ledgerCfg.ReconcileAfter = o.FirestoreHost, o.ReconcileAfter
	recorderCfg := instance.Defaults[instance.Recorder]()
	recorderCfg.Ledger = ledgerCfg
	relayCfg := instance.Defaults[relayfn.Config]().Relay
	relayCfg.TimeBudget = time.Duration(top.Relay.TimeBudgetSeconds) * time.Second
	relayCfg.BackoffBase, relayCfg.BackoffMax = time.Second, 30*time.Second
	if o.HealDelay > 0 {
		relayCfg.HealDelay = o.HealDelay
	}

	// Firestore: the stack's own ledger client and the topic_consumers
	// registry.
	store, err := fsopen.Ledger(ctx, ledgerCfg, o.Project, ledger.Options{Logger: o.Logger, Levels: model.LevelsOf(top)})
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, func(context.Context) { _ = store.Close() })
	s.Ledger = store
	// The registry must be seeded before the first event is recorded (its
	// expected consumers come from it); a Firestore that does not answer is
	// a clear error, not a start that hangs.
	sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
	_, err = ledgerconsumers.New(store.Client(), ledgerconsumers.Options{}).SyncConsumers(sctx, registry.Consumers(top), ledgerconsumers.SyncOptions{DisableUnlisted: true})
	scancel()
	if err != nil {
		return nil, fmt.Errorf("topic_consumers: Firestore at %s did not answer in 30 s: %w", o.FirestoreHost, err)
	}

	// The broker: the stack's own client (connecting is per driver: the
	// Pub/Sub client is also the push stand-in's, the Loop below), and the
	// topology's topics and subscriptions provisioned through the driver
	// (streams and durable consumers on NATS).
	var (
		ps *pubsub.Client
		nc *nats.Client
	)
	if onNATS {
		if nc, err = nats.Connect(ctx, o.NATSURL, nats.Options{Name: "relaybus-dev"}); err != nil {
			return nil, err
		}
		s.closers = append(s.closers, func(context.Context) { _ = nc.Close() })
		s.Broker = nc
	} else {
		if ps, err = brokeropen.PubSub(ctx, pubsubCfg, o.Project); err != nil {
			return nil, err
		}
		s.closers = append(s.closers, func(context.Context) { _ = ps.Close() })
		s.PubSub, s.Broker = ps, ps
	}
	if err := s.Broker.Provision(ctx, top); err != nil {
		return nil, fmt.Errorf("provision: %w", err)
	}
	// pushes: the broker has push subscriptions (broker.PushConfigurer:
	// Pub/Sub), which the Loop stands in for, pausing and resuming them
	// for the operations API. A broker without push (NATS JetStream) has
	// its consumers pull (CONSUMER_MODE=pull, as in production) and the
	// rollup and DLQ-monitor subscriptions pulled by bridges that POST
	// what they pull.
	_, pushes := broker.As[broker.PushConfigurer](s.Broker)

	// The functions, each under its own prefix, each closed (its ledger
	// writes flushed) at Close after the server has finished its requests.
	base := "http://" + ln.Addr().String()
	mux := http.NewServeMux()
	mux.Handle("/", notFound{})
	built := func(name string, h http.Handler, err error) error {
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if c, ok := h.(instance.Closer); ok {
			s.closers = append(s.closers, func(ctx context.Context) { _ = c.Close(ctx) })
		}
		return nil
	}
	pc := instance.Defaults[publish.Config]()
	pc.Env, pc.PubSub, pc.Ledger, pc.Relay = env, pubsubCfg, recorderCfg, relayCfg
	pc.DB.URL = fnURL(topology.MainDatabase, rolePublish)
	// A topic_consumers change shows within seconds (30 s in production).
	pc.RegistryTTL = 5 * time.Second
	// Every local caller is 127.0.0.1 (no identity without Cloud Run):
	// one bucket for the demo, the load generator and the user would be
	// no per-caller limit at all.
	pc.RateLimit = 0
	pub, err := publish.Build(ctx, pc)
	if err := built("publish", pub, err); err != nil {
		return nil, err
	}
	mount(mux, "/publish", pub)
	rc := instance.Defaults[relayfn.Config]()
	rc.Env, rc.PubSub, rc.Ledger, rc.Relay = env, pubsubCfg, recorderCfg, relayCfg
	rc.Databases, rc.DB.URL, rc.DatabaseURLs = dbNames, fnURL(topology.MainDatabase, roleRelay), relayOthers
	rh, err := relayfn.Build(ctx, rc)
	if err := built("relay", rh, err); err != nil {
		return nil, err
	}
	mount(mux, "/relay", rh)
	uc := instance.Defaults[rollup.Config]()
	uc.Env, uc.Ledger = env, ledgerCfg
	ru, err := rollup.Build(ctx, uc)
	if err := built("rollup", ru, err); err != nil {
		return nil, err
	}
	mount(mux, "/rollup", ru)
	var routes []Route
	var consumePaths, gapChecks []string
	for _, c := range top.Consumers() {
		if !c.IsEnabled() {
			continue
		}
		cc := consumeConfig(c, top)
		cc.Env, cc.PubSub, cc.Ledger = env, pubsubCfg, recorderCfg.Recording
		cc.DB.URL = fnURL(c.Database, roleConsumer)
		// A forward consumer's signing secret (forward_secret names a Secret
		// Manager secret in production) is Options.ForwardSigningSecret
		// locally.
		if c.ForwardSecret != "" {
			cc.ForwardSigningSecret = o.ForwardSigningSecret
		}
		if !pushes {
			// No push: the consumer pulls its durable consumer
			// itself, as in production, within its pool's share.
			cc.Mode, cc.PullMaxInFlight = consume.ModePull, shares[roleConsumer]
		}
		ch, err := consume.Build(ctx, cc)
		if err := built("consumer "+c.Subscription(), ch, err); err != nil {
			return nil, err
		}
		path := "/consume/" + c.Subscription()
		mount(mux, path, ch)
		consumePaths = append(consumePaths, base+path)
		if c.Handler == topology.HandlerStrict {
			gapChecks = append(gapChecks, base+path)
		}
		if !pushes {
			continue
		}
		// Backoff: the subscription's retry policy, scaled by BackoffScale.
		routes = append(routes, Route{Subscription: c.Subscription(), Topic: c.Topic, URL: base + path + "/", Mode: c.Delivery,
			MaxAttempts: c.MaxDeliveryAttempts})
	}
	// The delivery loop stands in for push and Eventarc; it also pauses
	// and resumes consumers for the operations API.
	loop := &Loop{Client: ps, Project: o.Project, BackoffScale: o.BackoffScale, Wakeup: wake, Logger: o.Logger}
	dc := instance.Defaults[dlqreplay.Config]()
	dc.Env, dc.PubSub, dc.Ledger = env, pubsubCfg, ledgerCfg
	dc.DB.URL, dc.DatabaseURLs = fnURL(topology.MainDatabase, roleOps), opsOthers
	// No auth locally (Cloud Run's IAM in production): the caller is
	// "anonymous", named here as the stack's one operator (an admin of
	// everything) and as the DLQ monitors' archiver, since every list is
	// closed when empty. One caller for everything: no rate limit.
	dc.Auth = dlqreplay.AuthNone
	dc.Writers = []string{dlqreplay.Anonymous}
	dc.Archivers = []string{dlqreplay.Anonymous}
	dc.RateLimit = 0
	if pushes {
		dc.Pauser = loop
	}
	ops, err := dlqreplay.Build(ctx, dc)
	if err := built("dlqreplay", ops, err); err != nil {
		return nil, err
	}
	mount(mux, "/dlqreplay", ops)
	for _, t := range top.Topics {
		routes = append(routes, Route{Subscription: names.DeadLetterMonitor(t.Name), Topic: names.DeadLetter(t.Name),
			URL: base + "/dlqreplay/deadletters:archive", Mode: topology.DeliveryPush})
	}
	routes = append(routes, Route{Subscription: broker.RollupSubscription(top), Topic: top.Rollup.Topic, URL: base + "/rollup/",
		Mode: topology.DeliveryPush, MaxInFlight: rollupMaxInFlight})
	if !pushes {
		// The Pub/Sub subscriptions' retry policies (pubsub.Provision),
		// scaled as the loop scales them.
		scaled := func(d time.Duration) time.Duration { return time.Duration(float64(d) * o.BackoffScale) }
		for i := range routes {
			routes[i].MinBackoff, routes[i].MaxBackoff = scaled(NoPolicyBackoff), scaled(NoPolicyBackoff)
			if routes[i].Topic == top.Rollup.Topic {
				routes[i].MinBackoff, routes[i].MaxBackoff = scaled(time.Second), scaled(time.Minute)
			}
		}
	}

	s.server = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.server.Serve(ln) }()
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.cancel = cancel
	// The scheduler: the jobs Terraform creates on Cloud Scheduler.
	jobs := []job{
		{base + "/rollup/expire", o.ExpireEvery},
		{base + "/rollup/reconcile", o.LedgerEvery},
	}
	for name := range s.Pools {
		jobs = append(jobs, job{base + "/relay/?database=" + name, o.RelayEvery})
	}
	for _, p := range consumePaths {
		jobs = append(jobs, job{p + "/ledger:ship", o.LedgerEvery}, job{p + "/inbox:purge", o.PurgeEvery})
	}
	for _, p := range gapChecks {
		jobs = append(jobs, job{p + "/gaps:check", o.LedgerEvery})
	}
	go func() {
		defer close(s.done)
		var wg sync.WaitGroup
		for _, j := range jobs {
			wg.Add(1)
			go func() { defer wg.Done(); schedule(runCtx, o.Logger, j.url, j.every) }()
		}
		if !pushes {
			runBridges(runCtx, s.Broker, o.Project, routes, o.Logger)
		} else {
			s.delivery = loop.Run(runCtx, routes)
		}
		wg.Wait()
	}()

	s.Info = Info{URL: base, DatabaseURL: o.DatabaseURL, Databases: urls, FirestoreHost: o.FirestoreHost, PubSubHost: o.PubSubHost, Project: o.Project,
		Transport: pubsubCfg.Transport, NATSURL: o.NATSURL, ConsumersPull: !pushes}
	if err := os.MkdirAll(o.StateDir, 0o755); err == nil {
		b, _ := json.MarshalIndent(s.Info, "", "  ")
		s.infoAt = filepath.Join(o.StateDir, "dev.json")
		_ = os.WriteFile(s.infoAt, b, 0o644)
	}
	var paths []string
	paths = append(paths, base+"/publish", base+"/relay", base+"/rollup")
	for _, rt := range routes {
		if strings.Contains(rt.URL, "/consume/") {
			paths = append(paths, strings.TrimSuffix(rt.URL, "/")+"  ("+rt.Mode+")")
		}
	}
	if !pushes {
		for _, p := range consumePaths {
			paths = append(paths, p+"  (pull)")
		}
	}
	paths = append(paths, base+"/dlqreplay/deadletters, /dlqreplay/events/{id}, /dlqreplay/traces/{id}, ...")
	s.Started = append(s.Started, "Functions   "+strings.Join(paths, "\n            "))
	s.Started = append(s.Started, "Console     "+base+"/dlqreplay/console/")
	if !pushes {
		s.Started = append(s.Started, fmt.Sprintf("Delivery    consumers pull their JetStream consumers (CONSUMER_MODE=pull; the topology's backoff, dead letters after max attempts); rollup and DLQ monitors: pull → POST as push would, backoff ×%g", o.BackoffScale))
	} else {
		s.Started = append(s.Started, fmt.Sprintf("Delivery    pull → POST as push/Eventarc would; redelivery after the subscription's backoff ×%g; dead letters after max attempts", o.BackoffScale))
	}
	s.Started = append(s.Started, fmt.Sprintf("Scheduler   POST /relay?database=<each> every %v; /rollup/reconcile, each consumer's /ledger:ship and each strict one's /gaps:check every %v; /rollup/expire every %v; /inbox:purge every %v",
		o.RelayEvery, o.LedgerEvery, o.ExpireEvery, o.PurgeEvery))
	return s, nil
}

func mount(mux *http.ServeMux, prefix string, h http.Handler) {
	mux.Handle(prefix+"/", http.StripPrefix(prefix, h))
	mux.Handle(prefix, h)
}

// job is one of the local scheduler's jobs.
type job struct {
	url   string
	every time.Duration
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
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
		return "", err
	}
	if !exists {
		if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
			var pg *pgconn.PgError
			if !errors.As(err, &pg) || pg.Code != "42P04" { // created meanwhile
				return "", fmt.Errorf("create database %s (or set %s): %w", name, db.EnvVar(), err)
			}
		}
	}
	u, err := url.Parse(mainURL)
	if err != nil || u.Scheme == "" {
		return "", fmt.Errorf("DATABASE_URL must be a postgres:// URL to derive %s from it (or set %s)", name, db.EnvVar())
	}
	u.Path = "/" + name
	// The main URL's search_path (a schema of its own, as the tests use) is
	// made in the new database too.
	if schema := cfg.RuntimeParams["search_path"]; schema != "" {
		c2, err := pgx.Connect(ctx, u.String())
		if err != nil {
			cfg2, _ := pgx.ParseConfig(u.String())
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
	return u.String(), nil
}

// schedule POSTs to url every d, as Cloud Scheduler calls the functions'
// jobs; a failed call is logged and the next tick tries again.
func schedule(ctx context.Context, log *slog.Logger, url string, d time.Duration) {
	t := time.NewTicker(d)
	defer t.Stop()
	client := &http.Client{Timeout: 2 * time.Minute}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
			resp, err := client.Do(req)
			if err != nil {
				if ctx.Err() == nil {
					log.Warn("local scheduler: call failed", "url", url, "error", err.Error())
				}
				continue
			}
			resp.Body.Close()
			if resp.StatusCode >= 300 {
				log.Warn("local scheduler: call refused", "url", url, "status", resp.StatusCode)
			}
		}
	}
}

// Close shuts the stack down gracefully, bounded by ctx: the scheduler and
// the delivery loop stop taking new work and finish the deliveries in
// flight (a message waiting out a backoff goes back to its subscription);
// then the server stops accepting requests and finishes those in flight;
// then everything the stack started stops.
func (s *Stack) Close(ctx context.Context) {
	if s.cancel != nil {
		s.cancel()
		select {
		case <-s.done:
			s.Delivery = s.delivery
		case <-ctx.Done():
		}
	}
	if s.server != nil {
		_ = s.server.Shutdown(ctx)
	}
	if s.drained != nil {
		s.drained(context.WithoutCancel(ctx))
	}
	// The child processes get a few seconds of their own to stop cleanly,
	// even when ctx is already done.
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i](stopCtx)
	}
	if s.infoAt != "" {
		_ = os.Remove(s.infoAt)
	}
}

// ReadInfo reads a running stack's info file from stateDir.
func ReadInfo(stateDir string) (Info, error) {
	b, err := os.ReadFile(filepath.Join(stateDir, "dev.json"))
	if err != nil {
		return Info{}, fmt.Errorf("no running stack (start it with make dev): %w", err)
	}
	var i Info
	if err := json.Unmarshal(b, &i); err != nil {
		return Info{}, err
	}
	return i, nil
}

// consumeConfig is what Terraform sets for a topology consumer's consume
// service (infra/terraform/run.tf, consume_env), over consume's defaults.
func consumeConfig(c topology.Consumer, top *topology.Topology) consume.Config {
	cc := instance.Defaults[consume.Config]()
	cc.ConsumerID, cc.Subscription, cc.Handler = c.Service, c.Subscription(), c.Handler
	cc.MaxDeliveryAttempts, cc.RollupTopic = c.MaxDeliveryAttempts, top.Rollup.Topic
	cc.ForwardURL, cc.ForwardAudience = c.ForwardURL, c.ForwardAudience
	if c.ForwardAuth != "" {
		cc.ForwardAuth = c.ForwardAuth
	}
	if c.ForwardTimeoutSeconds > 0 {
		cc.ForwardTimeout = time.Duration(c.ForwardTimeoutSeconds) * time.Second
	}
	if c.GapTimeoutSeconds > 0 {
		cc.GapTimeout = time.Duration(c.GapTimeoutSeconds) * time.Second
	}
	return cc
}

// rollupMaxInFlight is the delivery loop's bound on rollup notices in
// flight. Rollup holds a notice until every consumer its events expect has
// reported, at most ROLLUP_WINDOW (5 s), so the loop's 64 carried about
// 64/hold notices a second: at 50 purchases/s the notices queued behind
// the held ones and the ledger fell a minute and more behind (lag p50
// 14-44 s, p99 77-110 s on a quiet machine); at 512 it was 1.0 s, 1.2 s.
// Pub/Sub's push has no such small bound: it "dynamically adjusts the rate
// of push requests based on the rate at which it receives success
// responses" (https://cloud.google.com/pubsub/docs/push), and Cloud Run
// adds instances.
const rollupMaxInFlight = 1024
