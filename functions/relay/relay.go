// Package relay is the relay function: Cloud Scheduler POSTs to it (with an
// OIDC token; Cloud Run's IAM admits only the scheduler's identity) and it
// drains the outbox to Pub/Sub until nothing is due or its time budget
// (RELAY_TIME_BUDGET) runs out, answering a JSON summary:
//
//	{"claimed": 1200, "published": 1198, "retried": 2, "failed": 0,
//	 "remaining": 2, "failed_total": 0, "purged": 0, "ledger_healed": 0,
//	 "duration_ms": 412}
//
// It answers 500 with {"error": ...} and the partial summary when the drain
// stopped on an error, 405 for methods other than POST. The function
// registers itself as "relay" (functions.HTTP) and builds its dependencies
// once per instance from the environment (Config); New builds the handler
// from given dependencies for tests and the local stack, and works under
// http.StripPrefix.
package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
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

// New returns the relay function's handler: each POST drains for budget.
func New(r Drainer, budget time.Duration, log *slog.Logger) (http.Handler, error) {
	if r == nil || budget <= 0 {
		return nil, errors.New("relay: a relay and a positive time budget are required")
	}
	if log == nil {
		log = logging.Discard()
	}
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"error": "method " + req.Method + " not allowed: POST to drain the outbox"})
			return
		}
		sum, err := r.Drain(req.Context(), budget)
		if err != nil {
			writeJSON(w, http.StatusInternalServerError, struct {
				engine.Summary
				Error string `json:"error"`
			}{sum, err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, sum)
	}), nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// Config is the function's environment: relay.Env (GOOGLE_CLOUD_PROJECT,
// LOG_LEVEL, RELAYBUS_TOPOLOGY, DATABASE_URL, LEDGER, FIRESTORE_DATABASE and
// the RELAY_* settings).
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
	r, err := engine.Open(ctx, cfg, log)
	if err != nil {
		return nil, err
	}
	return New(r, cfg.TimeBudget, log)
}
