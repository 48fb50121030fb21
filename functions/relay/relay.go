// Package relay is the relay function: Cloud Scheduler POSTs to it (with an
// OIDC token; Cloud Run's IAM admits only the scheduler's identity) and it
// drains outbox databases to Pub/Sub until nothing is due or its time
// budget (RELAY_TIME_BUDGET) runs out. Every outbox database the topology
// declares (RELAY_DATABASES: main, and each consumer's own) has one
// Scheduler job that POSTs /?database=<name>; a POST without the parameter
// drains every database at once. It answers a JSON summary, the totals and
// one summary per database drained:
//
//	{"claimed": 1200, "published": 1198, "retried": 2, "failed": 0,
//	 "remaining": 2, "failed_total": 0, "purged": 0, "ledger_healed": 0,
//	 "duration_ms": 412, "databases": {"main": {...}}}
//
// It answers 500 with {"error": ...} and the partial summary when a drain
// stopped on an error (the error names the database, never its URL), 400
// for an unknown database, 405 for methods other than POST. The function
// registers itself as "relay" (functions.HTTP) and builds itself once per
// instance with Build from the environment (LoadConfig); the local stack
// and the tests call Build with their own Config. New builds the handler
// over given drainers (a relay's tests); it works under http.StripPrefix.
//
// The engine is imported under its own name, relay (as html/template
// imports text/template as template), the way consume refers to its
// engine as consumer: relay.Relay, relay.Summary, relay.New are the
// engine's; New and Handler are this function's.
package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/relaybus/relaybus/internal/privacy"
	"github.com/relaybus/relaybus/internal/privacy/topologyrules"

	"github.com/relaybus/relaybus/internal/ledger/model"

	"github.com/GoogleCloudPlatform/functions-framework-go/functions"

	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/internal/instance/brokeropen"
	"github.com/relaybus/relaybus/internal/instance/claimopen"
	"github.com/relaybus/relaybus/internal/instance/fsopen"
	"github.com/relaybus/relaybus/internal/instance/pgopen"
	"github.com/relaybus/relaybus/internal/ledger"
	"github.com/relaybus/relaybus/internal/logging"
	"github.com/relaybus/relaybus/internal/telemetry"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/relay"
	"github.com/relaybus/relaybus/shared/topology"
)

// Drainer is what the handler needs of the relay engine.
type Drainer interface {
	Drain(ctx context.Context, budget time.Duration) (relay.Summary, error)
}

// Answer is the function's JSON answer: the totals of the databases
// drained, each one's summary, and the first error.
type Answer struct {
	relay.Summary
	Databases map[string]relay.Summary `json:"databases"`
	Error     string                   `json:"error,omitempty"`
}

// Handler drains the outbox databases it was given.
type Handler struct {
	relays map[string]Drainer
	budget time.Duration
	log    *slog.Logger
	closer func(context.Context) error
}

// New returns the relay function's handler over one relay per database
// name: each POST drains for budget.
func New(relays map[string]Drainer, budget time.Duration, log *slog.Logger) (*Handler, error) {
	if len(relays) == 0 || budget <= 0 {
		return nil, errors.New("relay: at least one relay and a positive time budget are required")
	}
	if log == nil {
		log = logging.Discard()
	}
	return &Handler{relays: relays, budget: budget, log: log}, nil
}

// ServeHTTP drains ?database=<name>, or every database.
func (h *Handler) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"error": "method " + req.Method + " not allowed: POST to drain the outbox"})
		return
	}
	names := make([]string, 0, len(h.relays))
	if db := req.URL.Query().Get("database"); db != "" {
		if _, ok := h.relays[db]; !ok {
			known := make([]string, 0, len(h.relays))
			for n := range h.relays {
				known = append(known, n)
			}
			sort.Strings(known)
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "database: one of " + strings.Join(known, ", ") + " (RELAY_DATABASES)"})
			return
		}
		names = append(names, db)
	} else {
		for n := range h.relays {
			names = append(names, n)
		}
		sort.Strings(names)
	}
	ans := Answer{Databases: make(map[string]relay.Summary, len(names))}
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		errs []string
	)
	for _, n := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sum, err := h.relays[n].Drain(req.Context(), h.budget)
			mu.Lock()
			defer mu.Unlock()
			ans.Databases[n] = sum
			if err != nil {
				h.log.ErrorContext(req.Context(), "relay: drain failed", "database", n, "error", err.Error())
				errs = append(errs, "database "+n+": the drain stopped early (see the relay's logs)")
			}
		}()
	}
	wg.Wait()
	for _, s := range ans.Databases {
		add(&ans.Summary, s)
	}
	if len(errs) > 0 {
		sort.Strings(errs)
		ans.Error = strings.Join(errs, "; ")
		writeJSON(w, http.StatusInternalServerError, ans)
		return
	}
	writeJSON(w, http.StatusOK, ans)
}

// Close closes the relays (flushing their ledger writes) and clients, when
// the handler was built from the environment.
func (h *Handler) Close(ctx context.Context) error {
	if h.closer == nil {
		return nil
	}
	return h.closer(ctx)
}

func add(t *relay.Summary, s relay.Summary) {
	t.Claimed += s.Claimed
	t.Published += s.Published
	t.Retried += s.Retried
	t.Failed += s.Failed
	t.Lost += s.Lost
	t.Repushed += s.Repushed
	t.Remaining += s.Remaining
	t.FailedTotal += s.FailedTotal
	t.Purged += s.Purged
	t.LedgerHealed += s.LedgerHealed
	t.DurationMS = max(t.DurationMS, s.DurationMS)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// Config is the relay function's configuration: one relay per database
// of Databases, sharing one Pub/Sub client and one ledger.
type Config struct {
	instance.Env
	PubSub instance.PubSub
	Ledger instance.Recorder
	// Relay is each relay's tuning (RELAY_*; TimeBudget bounds one POST).
	Relay relay.Config
	// Databases are the names of the outbox databases to drain
	// (RELAY_DATABASES, comma-separated, default "main"): the topology's
	// databases.
	Databases []string `env:"RELAY_DATABASES, default=main"`
	// DB is the main database (DATABASE_URL).
	DB instance.Database
	// ClaimCheck is where messages over its threshold go (CLAIM_CHECK_*;
	// none when unset).
	ClaimCheck instance.ClaimCheck
	// DatabaseURLs are the other databases' URLs by name, each from its
	// topology.Database.EnvVar (DATABASE_URL_<NAME>); LoadConfig fills it.
	DatabaseURLs map[string]string
	// DatabaseDirectURLs are their direct URLs for migrations, each from
	// its topology.Database.DirectEnvVar (DATABASE_DIRECT_URL_<NAME>), when
	// the URL is a transaction-mode pooler; LoadConfig fills it.
	DatabaseDirectURLs map[string]string
}

// LoadConfig reads the configuration from the environment.
func LoadConfig(ctx context.Context) (Config, error) {
	c, err := instance.Load[Config](ctx)
	if err != nil {
		return c, err
	}
	c.DatabaseURLs = instance.DatabaseURLs(c.Databases)
	c.DatabaseDirectURLs = instance.DatabaseDirectURLs(c.Databases)
	return c, nil
}

func init() {
	functions.HTTP("relay", instance.Lazy("relay", instance.FromEnv(LoadConfig, Build)))
}

// Build is the relay function's one constructor, in production (from
// LoadConfig), in the local stack and in tests: the topology, one Pub/Sub
// client, the ledger unless Ledger.Mode is off, and for each database its
// pool (migrated) and its relay. Close closes them.
func Build(ctx context.Context, cfg Config) (*Handler, error) {
	log := cfg.Logger()
	top, err := topology.Load(cfg.Topology)
	if err != nil {
		return nil, err
	}
	var closers instance.Closers
	fail := func(err error) (*Handler, error) {
		_ = closers.Close(context.Background())
		return nil, err
	}
	// Before the pools, which trace their statements and report their
	// outbox's gauges; closed last, so it flushes everything else's spans.
	flush, err := cfg.StartTelemetry(ctx, "relay")
	if err != nil {
		return nil, err
	}
	closers.Add(flush)
	ps, err := brokeropen.Open(ctx, cfg.PubSub, cfg.ProjectID)
	if err != nil {
		return fail(err)
	}
	closers.Add(func(context.Context) error { return ps.Close() })
	store, err := fsopen.Recorder(ctx, cfg.Ledger, cfg.ProjectID, ledger.Options{Logger: log, Levels: model.LevelsOf(top), Privacy: topologyrules.Of(top)})
	if err != nil {
		return fail(err)
	}
	opts := cfg.Relay.Options()
	opts.Publisher, opts.Topology, opts.LedgerBudget = ps, top, cfg.Ledger.Budget
	// What the history keeps of each topic's payloads: its privacy rule's
	// history mode, hashed under the same key as the ledger's.
	var key privacy.Key
	if store != nil {
		key = store.PrivacyKey()
	} else if key, err = privacy.ConfiguredKey(cfg.Ledger.PrivacyKey, topologyrules.Of(top), log); err != nil {
		return fail(err)
	}
	opts.History.Keep = topologyrules.HistoryKeep(top, key)
	claims, closeClaims, err := claimopen.Open(ctx, cfg.ClaimCheck)
	if err != nil {
		return fail(err)
	}
	closers.Add(func(context.Context) error { return closeClaims() })
	if claims != nil {
		opts.Claims = claims
	}
	if store != nil {
		closers.Add(func(context.Context) error { return store.Close() })
		opts.Ledger = store
	}
	relays := make(map[string]Drainer, len(cfg.Databases))
	for _, name := range cfg.Databases {
		name = strings.TrimSpace(name)
		db, ok := top.Database(name)
		if !ok {
			return fail(fmt.Errorf("RELAY_DATABASES: %q is not a database of the topology", name))
		}
		dbCfg := instance.Database{URL: cfg.DatabaseURLs[name], DirectURL: cfg.DatabaseDirectURLs[name]}
		if name == topology.MainDatabase {
			dbCfg = cfg.DB
		}
		if dbCfg.URL == "" {
			return fail(fmt.Errorf("database %s: %s is not set", name, db.EnvVar()))
		}
		pool, err := pgopen.Open(ctx, dbCfg, outbox.Migrations)
		if err != nil {
			return fail(fmt.Errorf("database %s: %w", name, err))
		}
		closers.Add(func(context.Context) error { pool.Close(); return nil })
		unobserve := telemetry.ObserveOutbox(name, func(ctx context.Context) (telemetry.OutboxBacklog, error) { return relay.Backlog(ctx, pool) })
		closers.Add(func(context.Context) error { return unobserve() })
		o := opts
		o.DB, o.Logger = pool, log.With("database", name)
		r, err := relay.New(o)
		if err != nil {
			return fail(err)
		}
		closers.Add(r.Close)
		relays[name] = r
	}
	h, err := New(relays, cfg.Relay.TimeBudget, log)
	if err != nil {
		return fail(err)
	}
	h.closer = closers.Close
	return h, nil
}
