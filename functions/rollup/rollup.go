// Package rollup is the rollup function: it turns consumption attempts into
// each event's status in the Firestore ledger.
//
// consume publishes a notice (ledger.RollupMessage: the event id) to the
// rollup topic after every attempt it records; Pub/Sub delivers it here by
// push or Eventarc, and the function derives the event's status from the
// latest attempt of each expected consumer (ledger.Store.Rollup: one
// Firestore transaction, no write when nothing changes). Answers:
//
//   - 200: rolled up (the JSON body says the status and whether it changed),
//     or the notice was malformed and can never succeed: acknowledged with an
//     ERROR log line, never 400, which push would redeliver forever.
//   - 409: the event is not in the ledger yet (the relay's RecordSent failed
//     and will be replayed); Pub/Sub redelivers the notice with backoff until
//     the relay has healed the ledger. 409, not 5xx, so that the expected
//     healing window does not look like an outage.
//   - 500: Firestore failed; Pub/Sub redelivers.
//
// POST <root>/expire runs the expiry sweep (ledger.Store.ExpireDue) for
// Cloud Scheduler: events nobody reports on become EXPIRED after their
// expireAt. It answers {"due", "expired", "more"}.
//
// The function registers itself as the HTTP function "rollup"
// (functions.HTTP) and builds its dependencies once per instance from the
// environment (Config). New builds the same handler from given
// dependencies for tests and the local stack; it works under
// http.StripPrefix.
package rollup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/GoogleCloudPlatform/functions-framework-go/functions"
	"github.com/sethvargo/go-envconfig"

	"github.com/relaybus/relaybus/shared/delivery"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/instance"
	"github.com/relaybus/relaybus/shared/ledger"
	"github.com/relaybus/relaybus/shared/logging"
)

// Config is the function's environment.
type Config struct {
	// Env is what every function reads (GOOGLE_CLOUD_PROJECT, LOG_LEVEL,
	// RELAYBUS_TOPOLOGY).
	instance.Env
	// Database is the Firestore database id (FIRESTORE_DATABASE, "(default)").
	Database string `env:"FIRESTORE_DATABASE, default=(default)"`
}

// Ledger is what the function needs of the ledger (*ledger.Store).
type Ledger interface {
	Rollup(ctx context.Context, eventID string) (ledger.RollupResult, error)
	ExpireDue(ctx context.Context, limit int) (ledger.ExpireReport, error)
}

// Deps are the function's dependencies.
type Deps struct {
	// Ledger is required.
	Ledger Ledger
	// Logger defaults to logging.Discard.
	Logger *slog.Logger
	// ExpireBudget bounds one /expire call (default 45 s, inside Cloud
	// Scheduler's attempt deadline); the sweep stops between batches.
	ExpireBudget time.Duration
}

// maxNoticeBody bounds a notice request; notices are tiny, and anything
// larger is malformed.
const maxNoticeBody = 1 << 20

// New returns the rollup handler.
func New(_ context.Context, d Deps) (http.Handler, error) {
	if d.Ledger == nil {
		return nil, errors.New("rollup: no ledger")
	}
	if d.Logger == nil {
		d.Logger = logging.Discard()
	}
	if d.ExpireBudget <= 0 {
		d.ExpireBudget = 45 * time.Second
	}
	return &handler{Deps: d}, nil
}

type handler struct{ Deps }

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "rollup accepts POST only", http.StatusMethodNotAllowed)
		return
	}
	if strings.TrimSuffix(r.URL.Path, "/") == "/expire" {
		h.expire(w, r)
		return
	}
	h.notice(w, r)
}

// noticeAnswer is the JSON body of a handled notice.
type noticeAnswer struct {
	EventID  string        `json:"eventId,omitempty"`
	Status   ledger.Status `json:"status,omitempty"`
	Previous ledger.Status `json:"previous,omitempty"`
	Changed  bool          `json:"changed"`
	Error    string        `json:"error,omitempty"`
}

func (h *handler) notice(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	d, err := delivery.Read(r, maxNoticeBody)
	if err != nil {
		h.malformed(ctx, w, "", err, nil)
		return
	}
	attrs := []any{"delivery_mode", d.Mode, "message_id", d.Message.ID, "subscription", d.Subscription}
	id, err := ledger.RollupEventID(d.Message)
	if err != nil {
		h.malformed(ctx, w, "", err, attrs)
		return
	}
	res, err := h.Ledger.Rollup(ctx, id)
	switch {
	case err == nil:
	case errors.Is(err, event.ErrInvalid):
		h.malformed(ctx, w, id, err, attrs)
		return
	case errors.Is(err, ledger.ErrEventNotFound):
		h.Logger.WarnContext(ctx, "rollup: event not in the ledger yet; the notice will be redelivered", append(attrs, "event_id", id)...)
		writeJSON(w, http.StatusConflict, noticeAnswer{EventID: id, Error: "event not in the ledger yet"})
		return
	default:
		h.Logger.ErrorContext(ctx, "rollup failed; the notice will be redelivered", append(attrs, "event_id", id, "error", err.Error())...)
		writeJSON(w, http.StatusInternalServerError, noticeAnswer{EventID: id, Error: "rollup failed"})
		return
	}
	fields := append(logging.Event(res.Event.LogEvent()), attrs...)
	fields = append(fields, "status", res.Status, "previous_status", res.Previous,
		"expected", res.Expected, "reported", res.Reported, "succeeded", res.Succeeded, "coalesced", res.Coalesced)
	if res.Changed {
		h.Logger.InfoContext(ctx, "rollup: status changed", fields...)
	} else {
		h.Logger.DebugContext(ctx, "rollup: status unchanged", fields...)
	}
	writeJSON(w, http.StatusOK, noticeAnswer{EventID: id, Status: res.Status, Previous: res.Previous, Changed: res.Changed})
}

// malformed acknowledges a notice that can never succeed.
func (h *handler) malformed(ctx context.Context, w http.ResponseWriter, id string, err error, attrs []any) {
	fields := append(attrs, "error", err.Error())
	if id != "" {
		fields = append(fields, "event_id", id)
	}
	h.Logger.ErrorContext(ctx, "rollup: malformed notice acknowledged and dropped", fields...)
	writeJSON(w, http.StatusOK, noticeAnswer{EventID: id, Error: "malformed notice: " + err.Error()})
}

// expireAnswer is the JSON body of /expire.
type expireAnswer struct {
	Due     int    `json:"due"`
	Expired int    `json:"expired"`
	More    bool   `json:"more"`
	Error   string `json:"error,omitempty"`
}

func (h *handler) expire(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	limit := 0
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 10000 {
			writeJSON(w, http.StatusBadRequest, expireAnswer{Error: "limit: an integer from 1 to 10000"})
			return
		}
		limit = n
	}
	deadline := time.Now().Add(h.ExpireBudget)
	var total expireAnswer
	for {
		rep, err := h.Ledger.ExpireDue(ctx, limit)
		total.Due += rep.Due
		total.Expired += rep.Expired
		total.More = rep.More
		if err != nil {
			h.Logger.ErrorContext(ctx, "expiry sweep failed", "error", err.Error(), "due", total.Due, "expired", total.Expired)
			total.Error = "expiry sweep failed"
			writeJSON(w, http.StatusInternalServerError, total)
			return
		}
		if !rep.More || time.Now().After(deadline) || rep.Expired == 0 {
			break
		}
	}
	h.Logger.InfoContext(ctx, "expiry sweep", "due", total.Due, "expired", total.Expired, "more", total.More)
	writeJSON(w, http.StatusOK, total)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func init() {
	functions.HTTP("rollup", instance.Lazy("rollup", fromEnv))
}

// fromEnv builds the instance's handler from the environment (Config).
func fromEnv(ctx context.Context) (http.Handler, error) {
	var cfg Config
	if err := envconfig.Process(ctx, &cfg); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	log := cfg.Logger()
	store, err := ledger.Open(ctx, ledger.Config{ProjectID: cfg.ProjectID, Database: cfg.Database}, ledger.Options{Logger: log})
	if err != nil {
		return nil, err
	}
	h, err := New(ctx, Deps{Ledger: store, Logger: log})
	if err != nil {
		_ = store.Close()
		return nil, err
	}
	return h, nil
}
