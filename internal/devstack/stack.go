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
//
// Start composes one step per concern, each taking the results of the
// steps before it and pushing what it starts onto one teardown: the
// services (services.go: postgres.go's cluster, firestore.go's emulator,
// broker.go's pstest or embedded NATS), the databases and their
// migrations (postgres.go), the ledger and its registry (firestore.go),
// the broker's client and provisioning (broker.go), the functions
// (functions.go), then the delivery stand-in (delivery.go) and the
// scheduler (scheduler.go).
package devstack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relaybus/relaybus/internal/emulator"
	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/internal/ledger"
	"github.com/relaybus/relaybus/internal/pgcluster"
	"github.com/relaybus/relaybus/shared/broker"
	"github.com/relaybus/relaybus/shared/broker/pubsub"
	"github.com/relaybus/relaybus/shared/topology"

	_ "github.com/relaybus/relaybus/examples/shop" // the demo topology's handlers
)

// Options configure Start. The zero value runs everything locally.
type Options struct {
	// Addr is where the functions listen (DefaultAddr).
	Addr string
	// StateDir holds the throwaway Postgres cluster and the stack's info
	// file (DefaultStateDir).
	StateDir string
	// Project is the Google Cloud project the emulators see
	// (DefaultProject).
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
	// Functions are the functions' configurations the stack builds them
	// from (nil: DefaultFunctions; make dev loads them from the
	// environment, LoadConfig). A forward consumer (one whose topology
	// entry names a forward_secret) signs with Consume's
	// ForwardSigningSecret.
	Functions *Functions
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
	down    teardown
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

// Start starts everything and returns once the stack serves: the
// services (Postgres, Firestore, the broker), the databases, the ledger,
// the broker's topics and subscriptions, the functions, then the
// scheduler and the delivery stand-in, each a step of its own whose result
// the next steps take. A missing prerequisite fails it before anything
// starts (see Check); so do an unknown transport and a busy address. A
// step that fails stops everything started before it, in the reverse
// order, before Start returns.
func Start(ctx context.Context, o Options) (s *Stack, err error) {
	o = o.withDefaults()
	lb, err := localBrokerOf(o.Transport)
	if err != nil {
		return nil, err
	}
	if err := Check(o); err != nil {
		return nil, err
	}
	s = &Stack{done: make(chan struct{}), drained: o.Drained}
	defer func(started *Stack) { // s is nil by the time a failure's defer runs
		if err != nil {
			started.Close(context.Background())
		}
	}(s)
	ln, err := listen(o.Addr, &s.down)
	if err != nil {
		return nil, err
	}
	if s.Topology, err = topology.Load(o.Topology); err != nil {
		return nil, err
	}
	sv, err := startServices(ctx, o, lb, &s.down)
	if err != nil {
		return nil, err
	}
	s.Started = append(s.Started, sv.Started...)
	dbs, err := openDatabases(ctx, sv.Postgres.URL, o.PostgresBudget, s.Topology, &s.down)
	if err != nil {
		return nil, err
	}
	s.Pools, s.Pool = dbs.Pools, dbs.Pools[topology.MainDatabase]
	ledgerCfg := o.Functions.Rollup.Ledger
	ledgerCfg.EmulatorHost, ledgerCfg.ReconcileAfter = sv.Firestore.Host, o.ReconcileAfter
	if s.Ledger, err = openLedger(ctx, ledgerCfg, o.Project, s.Topology, o.Logger, &s.down); err != nil {
		return nil, err
	}
	br, err := connectBroker(ctx, lb, sv.Broker.Config, o.Project, s.Topology, &s.down)
	if err != nil {
		return nil, err
	}
	s.Broker, s.PubSub = br.Broker, br.PubSub
	dl := newDelivery(br, sv.Broker.Wakeup, o)
	base := "http://" + ln.Addr().String()
	env := instance.Defaults[instance.Env]()
	env.ProjectID, env.Topology, env.LogHandler = o.Project, o.Topology, o.Logger.Handler()
	in := functionsInput{Base: base, Functions: *o.Functions, Env: env, Broker: sv.Broker.Config, Ledger: ledgerCfg,
		HealDelay: o.HealDelay, DBs: dbs, Topology: s.Topology, Pushes: br.Pushes}
	if dl.loop != nil {
		in.Pauser = dl.loop
		in.Forwarders = &Forwarders{Client: br.PubSub, Loop: dl.loop}
	}
	fns, err := buildFunctions(ctx, in, &s.down)
	if err != nil {
		return nil, err
	}
	dl.route(base, s.Topology, fns.Consumers, o.BackoffScale)
	s.run(ctx, ln, fns.Mux, jobs(base, o, dbs.Names, fns.Consumers, br.Pushes), dl, o.Logger)

	s.Info = Info{URL: base, DatabaseURL: sv.Postgres.URL, Databases: dbs.URLs, FirestoreHost: sv.Firestore.Host,
		PubSubHost: sv.Broker.Config.EmulatorHost, Project: o.Project, Transport: sv.Broker.Config.Transport,
		NATSURL: sv.Broker.Config.NATSURL, ConsumersPull: !br.Pushes}
	s.writeInfo(o.StateDir)
	s.Started = append(s.Started, readyLines(base, o, fns.Consumers, br.Pushes)...)
	return s, nil
}

// withDefaults is o with every zero option at its default.
func (o Options) withDefaults() Options {
	if o.Addr == "" {
		o.Addr = DefaultAddr
	}
	if o.StateDir == "" {
		o.StateDir = DefaultStateDir
	}
	if o.Project == "" {
		o.Project = DefaultProject
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
		o.BackoffScale = DefaultBackoffScale
	}
	if o.PostgresBudget <= 0 {
		o.PostgresBudget = DefaultPostgresBudget
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Functions == nil {
		f := DefaultFunctions()
		o.Functions = &f
	}
	return o
}

// listen takes the stack's address first, so a busy one fails the start
// before anything else starts.
func listen(addr string, down *teardown) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("cannot listen on %s (is something else using the port? set -addr): %w", addr, err)
	}
	down.push(func(context.Context) { ln.Close() })
	return ln, nil
}

// run serves mux on ln, and runs the scheduler (the jobs Terraform creates
// on Cloud Scheduler) and the delivery stand-in until Close.
func (s *Stack) run(ctx context.Context, ln net.Listener, mux http.Handler, js []job, d *standIn, log *slog.Logger) {
	s.server = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.server.Serve(ln) }()
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.cancel = cancel
	go func() {
		defer close(s.done)
		var wg sync.WaitGroup
		wg.Go(func() { runScheduler(runCtx, log, js) })
		s.delivery = d.run(runCtx)
		wg.Wait()
	}()
}

// writeInfo writes s.Info to <stateDir>/dev.json for the stack's clients
// (make demo, make load); Close removes it.
func (s *Stack) writeInfo(stateDir string) {
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return
	}
	b, _ := json.MarshalIndent(s.Info, "", "  ")
	s.infoAt = filepath.Join(stateDir, "dev.json")
	_ = os.WriteFile(s.infoAt, b, 0o644)
}

// readyLines say where the functions are, how they are delivered to and
// what the scheduler calls.
func readyLines(base string, o Options, consumers []mountedConsumer, pushes bool) []string {
	paths := []string{base + "/publish", base + "/relay", base + "/rollup"}
	for _, c := range consumers {
		mode := "pull"
		if pushes {
			mode = c.Delivery
		}
		paths = append(paths, c.URL+"  ("+mode+")")
	}
	paths = append(paths, base+"/dlqreplay/deadletters, /dlqreplay/events/{id}, /dlqreplay/traces/{id}, ...")
	lines := []string{"Functions   " + strings.Join(paths, "\n            "), "Console     " + base + "/dlqreplay/console/"}
	if pushes {
		lines = append(lines, fmt.Sprintf("Delivery    pull → POST as push/Eventarc would; redelivery after the subscription's backoff ×%g; dead letters after max attempts", o.BackoffScale))
	} else {
		lines = append(lines, fmt.Sprintf("Delivery    consumers pull their JetStream consumers (CONSUMER_MODE=pull; the topology's backoff, dead letters after max attempts); rollup and DLQ monitors: pull → POST as push would, backoff ×%g", o.BackoffScale))
	}
	return append(lines, fmt.Sprintf("Scheduler   POST /relay?database=<each> every %v; /rollup/reconcile, each consumer's /ledger:ship and each strict one's /gaps:check every %v; /rollup/expire every %v; /inbox:purge every %v",
		o.RelayEvery, o.LedgerEvery, o.ExpireEvery, o.PurgeEvery))
}

// Close shuts the stack down gracefully, bounded by ctx: the scheduler and
// the delivery loop stop taking new work and finish the deliveries in
// flight (a message waiting out a backoff goes back to its subscription);
// then the server stops accepting requests and finishes those in flight;
// then everything the stack started stops, in the reverse order.
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
	s.down.close(stopCtx)
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
