// Package devstack runs the whole of relaybus on one machine, as `make dev`
// does: Postgres (DATABASE_URL, or a throwaway cluster under .state/), Pub/Sub
// (PUBSUB_EMULATOR_HOST, or in-process pstest), Firestore
// (FIRESTORE_EMULATOR_HOST, or the gcloud emulator), the topics,
// subscriptions and topic_consumers registry from infra/topology.yaml, the
// functions on one address, a delivery loop standing in for Eventarc and
// push, and a scheduler calling relay.
//
// Paths on the one address: /publish, /relay, /consume/<subscription-id>
// (one per consumer in the topology), /rollup, /dlqreplay/... (the
// operations API, no auth locally; the DLQ monitor subscriptions deliver to
// its archive).
package devstack

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relaybus/relaybus/functions/consume"
	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/functions/publish"
	relayfn "github.com/relaybus/relaybus/functions/relay"
	"github.com/relaybus/relaybus/functions/rollup"
	"github.com/relaybus/relaybus/internal/emulator"
	"github.com/relaybus/relaybus/internal/pgcluster"
	"github.com/relaybus/relaybus/shared/archive"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/ledger"
	"github.com/relaybus/relaybus/shared/names"
	"github.com/relaybus/relaybus/shared/registry"
	"github.com/relaybus/relaybus/shared/relay"
	"github.com/relaybus/relaybus/shared/topology"
	"github.com/relaybus/relaybus/shared/transport"

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
	// RelayEvery is the local scheduler's cadence (2s; Cloud Scheduler runs
	// every minute, but child events should not wait a minute locally).
	RelayEvery time.Duration
	// Logger receives the stack's and the functions' logs.
	Logger *slog.Logger
}

// Info is what a running stack tells its clients (the demo): it is written
// to <StateDir>/dev.json.
type Info struct {
	URL           string `json:"url"`
	DatabaseURL   string `json:"databaseUrl"`
	FirestoreHost string `json:"firestoreHost"`
	PubSubHost    string `json:"pubsubHost"`
	Project       string `json:"project"`
}

// Stack is a running local stack.
type Stack struct {
	Info     Info
	Started  []string
	Ledger   *ledger.Store
	Pool     *pgxpool.Pool
	PubSub   *transport.Client
	Topology *topology.Topology

	server  *http.Server
	cancel  context.CancelFunc
	done    chan struct{}
	closers []func(context.Context)
	infoAt  string
}

// Start starts everything and returns once the stack serves.
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
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	s = &Stack{done: make(chan struct{})}
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

	// Postgres.
	if o.DatabaseURL == "" {
		if _, err := pgcluster.BinDir(); err != nil {
			return nil, fmt.Errorf("PostgreSQL server binaries not found: install them (apt-get install postgresql) or set DATABASE_URL: %w", err)
		}
		dir, _ := filepath.Abs(filepath.Join(o.StateDir, "postgres"))
		if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
			return nil, err
		}
		c, err := pgcluster.Start(ctx, pgcluster.Options{DataDir: dir})
		if err != nil {
			return nil, fmt.Errorf("postgres: %w", err)
		}
		s.closers = append(s.closers, func(ctx context.Context) { _ = c.Stop(ctx) })
		o.DatabaseURL = c.URL
		s.Started = append(s.Started, fmt.Sprintf("PostgreSQL  %s (data in %s)", c.URL, dir))
	}
	pool, err := pgxpool.New(ctx, o.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	s.closers = append(s.closers, func(context.Context) { pool.Close() })
	s.Pool = pool
	if err := consume.Migrate(ctx, pool); err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}

	// Firestore.
	if o.FirestoreHost == "" {
		if err := emulator.Check(emulator.Firestore); err != nil {
			return nil, fmt.Errorf("the Firestore emulator cannot start: install the gcloud SDK with cloud-firestore-emulator and Java 17, or set FIRESTORE_EMULATOR_HOST: %w", err)
		}
		p, err := emulator.Start(ctx, emulator.Firestore, emulator.Options{})
		if err != nil {
			return nil, fmt.Errorf("firestore emulator: %w", err)
		}
		s.closers = append(s.closers, func(context.Context) { p.Stop() })
		o.FirestoreHost = p.Host
		s.Started = append(s.Started, "Firestore   emulator on "+p.Host)
	}
	os.Setenv("FIRESTORE_EMULATOR_HOST", o.FirestoreHost)
	store, err := ledger.Open(ctx, ledger.Config{ProjectID: o.Project, Database: ledger.DefaultDatabase}, ledger.Options{Logger: o.Logger})
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, func(context.Context) { _ = store.Close() })
	s.Ledger = store
	if _, err := store.SyncConsumers(ctx, registry.Consumers(top), ledger.SyncOptions{DisableUnlisted: true}); err != nil {
		return nil, fmt.Errorf("topic_consumers: %w", err)
	}

	// Pub/Sub.
	if o.PubSubHost == "" {
		srv := pstest.NewServer()
		s.closers = append(s.closers, func(ctx context.Context) {
			// pstest's Close can deadlock on its own delivery goroutines
			// after heavy use; the process is ending anyway, so wait only a
			// little.
			done := make(chan struct{})
			go func() { _ = srv.Close(); close(done) }()
			select {
			case <-done:
			case <-time.After(2 * time.Second):
			case <-ctx.Done():
			}
		})
		o.PubSubHost = srv.Addr
		s.Started = append(s.Started, "Pub/Sub     in-process pstest on "+srv.Addr)
	}
	ps, err := transport.Dial(ctx, o.Project, o.PubSubHost, transport.Options{})
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, func(context.Context) { _ = ps.Close() })
	s.PubSub = ps
	if err := transport.Provision(ctx, ps, top, transport.ProvisionOptions{}); err != nil {
		return nil, fmt.Errorf("provision: %w", err)
	}

	// The functions.
	base := "http://" + ln.Addr().String()
	mux := http.NewServeMux()
	r, err := relay.New(relay.Options{DB: pool, Publisher: ps, Topology: top, Ledger: store, Logger: o.Logger,
		BackoffBase: time.Second, BackoffMax: 30 * time.Second})
	if err != nil {
		return nil, err
	}
	pub, err := publish.New(publish.Options{DB: pool, Registry: registry.Cached(store, 5*time.Second), FastPath: r, Logger: o.Logger})
	if err != nil {
		return nil, err
	}
	mount(mux, "/publish", pub)
	rh, err := relayfn.New(r, time.Duration(top.Relay.TimeBudgetSeconds)*time.Second, o.Logger)
	if err != nil {
		return nil, err
	}
	mount(mux, "/relay", rh)
	ru, err := rollup.New(ctx, rollup.Deps{Ledger: store, Logger: o.Logger})
	if err != nil {
		return nil, err
	}
	mount(mux, "/rollup", ru)
	recorder := ledger.NewRecorder(store, ps, top.Rollup.Topic)
	var routes []Route
	for _, c := range top.Consumers() {
		if !c.IsEnabled() {
			continue
		}
		h, err := consume.BuildHandler(c.Handler, consume.HandlerConfig{ConsumerID: c.Service, ForwardURL: c.ForwardURL})
		if err != nil {
			return nil, fmt.Errorf("consumer %s: %w", c.Subscription(), err)
		}
		if m, ok := h.(consume.Migrator); ok {
			if err := m.Migrate(ctx, pool); err != nil {
				return nil, err
			}
		}
		e, err := consumer.New(consumer.Options{DB: pool, ConsumerID: c.Service, Subscription: c.Subscription(), Handler: h,
			DeadLetters: ps, Ledger: recorder, MaxDeliveryAttempts: c.MaxDeliveryAttempts, Logger: o.Logger})
		if err != nil {
			return nil, err
		}
		ch, err := consume.New(consume.Options{Engine: e, DB: pool, Logger: o.Logger})
		if err != nil {
			return nil, err
		}
		path := "/consume/" + c.Subscription()
		mount(mux, path, ch)
		routes = append(routes, Route{Subscription: c.Subscription(), Topic: c.Topic, URL: base + path + "/", Mode: c.Delivery,
			// Local redeliveries come faster than the production backoff so
			// the demo's planned failure clears in a second.
			MinBackoff: 500 * time.Millisecond, MaxBackoff: 5 * time.Second, MaxAttempts: c.MaxDeliveryAttempts})
	}
	ops, err := dlqreplay.New(dlqreplay.Options{Archive: archive.New(store.Client()), Ledger: store, DB: pool, Publisher: ps,
		Auth: dlqreplay.AuthNone, Logger: o.Logger})
	if err != nil {
		return nil, err
	}
	mount(mux, "/dlqreplay", ops)
	for _, t := range top.Topics {
		routes = append(routes, Route{Subscription: names.DeadLetterMonitor(t.Name), Topic: names.DeadLetter(t.Name),
			URL: base + "/dlqreplay/deadletters:archive", Mode: topology.DeliveryPush,
			MinBackoff: 500 * time.Millisecond, MaxBackoff: 5 * time.Second})
	}
	routes = append(routes, Route{Subscription: transport.RollupSubscription(top), Topic: top.Rollup.Topic, URL: base + "/rollup/",
		Mode: topology.DeliveryPush, MinBackoff: 100 * time.Millisecond, MaxBackoff: time.Second})

	s.server = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.server.Serve(ln) }()
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.cancel = cancel
	loop := &Loop{Client: ps, Project: o.Project, HTTP: &http.Client{Timeout: 60 * time.Second}, Logger: o.Logger}
	go func() {
		defer close(s.done)
		go schedule(runCtx, base+"/relay/", o.RelayEvery)
		loop.Run(runCtx, routes)
	}()

	s.Info = Info{URL: base, DatabaseURL: o.DatabaseURL, FirestoreHost: o.FirestoreHost, PubSubHost: o.PubSubHost, Project: o.Project}
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
	paths = append(paths, base+"/dlqreplay/deadletters, /dlqreplay/events/{id}, /dlqreplay/traces/{id}, ...")
	s.Started = append(s.Started, "Functions   "+strings.Join(paths, "\n            "))
	s.Started = append(s.Started, fmt.Sprintf("Scheduler   POST %s/relay every %v", base, o.RelayEvery))
	return s, nil
}

func mount(mux *http.ServeMux, prefix string, h http.Handler) {
	mux.Handle(prefix+"/", http.StripPrefix(prefix, h))
	mux.Handle(prefix, h)
}

// schedule POSTs to url every d, as Cloud Scheduler calls relay.
func schedule(ctx context.Context, url string, d time.Duration) {
	t := time.NewTicker(d)
	defer t.Stop()
	client := &http.Client{Timeout: 2 * time.Minute}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
			if resp, err := client.Do(req); err == nil {
				resp.Body.Close()
			}
		}
	}
}

// Close stops accepting requests, lets in-flight work finish (bounded by
// ctx), then stops the delivery loop and every service the stack started.
func (s *Stack) Close(ctx context.Context) {
	if s.server != nil {
		_ = s.server.Shutdown(ctx)
	}
	if s.cancel != nil {
		s.cancel()
		select {
		case <-s.done:
		case <-ctx.Done():
		}
	}
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i](ctx)
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
