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
// registers itself as "relay" (functions.HTTP) and builds its dependencies
// once per instance from the environment (Config); New builds the handler
// from given relays for tests and the local stack, and works under
// http.StripPrefix.
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

	"github.com/GoogleCloudPlatform/functions-framework-go/functions"
	"github.com/sethvargo/go-envconfig"

	"github.com/relaybus/relaybus/shared/instance"
	"github.com/relaybus/relaybus/shared/logging"
	engine "github.com/relaybus/relaybus/shared/relay"
)

// Drainer is what the handler needs of the relay engine.
type Drainer interface {
	Drain(ctx context.Context, budget time.Duration) (engine.Summary, error)
}

// Answer is the function's JSON answer: the totals of the databases
// drained, each one's summary, and the first error.
type Answer struct {
	engine.Summary
	Databases map[string]engine.Summary `json:"databases"`
	Error     string                    `json:"error,omitempty"`
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
	ans := Answer{Databases: make(map[string]engine.Summary, len(names))}
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

func add(t *engine.Summary, s engine.Summary) {
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

// Config is the function's environment: relay.Env (GOOGLE_CLOUD_PROJECT,
// LOG_LEVEL, RELAYBUS_TOPOLOGY, RELAY_DATABASES and each database's URL,
// LEDGER, FIRESTORE_DATABASE, LEDGER_RETENTION and the RELAY_* settings).
type Config = engine.Env

func init() {
	functions.HTTP("relay", instance.Lazy("relay", fromEnv))
}

func fromEnv(ctx context.Context) (http.Handler, error) {
	var cfg Config
	if err := envconfig.Process(ctx, &cfg); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	log := cfg.Logger()
	flush, err := cfg.StartTelemetry(ctx, "relay") // before Open, which registers the outbox gauges
	if err != nil {
		return nil, err
	}
	set, err := engine.Open(ctx, cfg, log)
	if err != nil {
		_ = flush(ctx)
		return nil, err
	}
	relays := make(map[string]Drainer, len(set.Relays))
	for n, r := range set.Relays {
		relays[n] = r
	}
	h, err := New(relays, cfg.TimeBudget, log)
	if err != nil {
		_ = set.Close(ctx)
		_ = flush(ctx)
		return nil, err
	}
	h.closer = func(ctx context.Context) error { return errors.Join(set.Close(ctx), flush(ctx)) }
	return h, nil
}
