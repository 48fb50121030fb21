// Package consume is the consume function: one deployment per consumer
// (CONSUMER_ID), delivered by Eventarc or an ordered push subscription. It
// accepts every request shape Google sends (shared/delivery: Eventarc
// messagePublished in binary or structured mode, wrapped push with
// deliveryAttempt, unwrapped push) and hands each message to the consumer
// engine (shared/consumer): inbox dedup, the configured handler and child
// events in one Postgres transaction, the attempt recorded in the ledger.
//
// Answers: 200 acknowledges (applied, duplicate, permanent error recorded,
// poison dead-lettered, addressed to another consumer); 503 asks Pub/Sub to
// redeliver (transient error; dead-lettered after the subscription's
// maximum attempts). It never answers 400: push would redeliver a 400
// forever. The ledger never changes an answer: attempts are committed in
// Postgres with the delivery and recorded in Firestore afterwards.
//
// Two more routes, for Cloud Scheduler jobs: POST /ledger:ship records in
// the ledger the attempts its background shipper missed (every minute),
// POST /inbox:purge deletes inbox rows and shipped attempts older than
// INBOX_RETENTION (daily). Both answer a JSON report; a failure answers 500
// without the database's details.
//
// The handler is chosen by name (CONSUMER_HANDLER): projection (latest state
// per aggregate, version-gated), strict (every version in order, then the
// projection), forward (POST each event as a CloudEvent to FORWARD_URL), or
// a name a Go package registered with RegisterHandler.
package consume

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

	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/delivery"
	"github.com/relaybus/relaybus/shared/forward"
	"github.com/relaybus/relaybus/shared/inbox"
	"github.com/relaybus/relaybus/shared/logging"
	"github.com/relaybus/relaybus/shared/projection"
)

// HandlerConfig is what a handler factory may read.
type HandlerConfig struct {
	// ConsumerID names the consumer.
	ConsumerID string
	// ForwardURL is FORWARD_URL.
	ForwardURL string
}

// HandlerFactory builds a named handler.
type HandlerFactory func(HandlerConfig) (consumer.Handler, error)

var (
	handlersMu sync.RWMutex
	handlers   = map[string]HandlerFactory{
		"projection": func(HandlerConfig) (consumer.Handler, error) { return projection.Latest(), nil },
		"strict":     func(HandlerConfig) (consumer.Handler, error) { return projection.Strict(projection.Latest()), nil },
		"forward": func(c HandlerConfig) (consumer.Handler, error) {
			return forward.New(forward.Options{URL: c.ForwardURL})
		},
	}
)

// RegisterHandler makes a handler selectable by name (CONSUMER_HANDLER).
// Call it from an init function; registering a name twice panics.
func RegisterHandler(name string, f HandlerFactory) {
	handlersMu.Lock()
	defer handlersMu.Unlock()
	if _, dup := handlers[name]; dup {
		panic("consume: handler " + name + " registered twice")
	}
	handlers[name] = f
}

// BuildHandler returns the handler registered as name.
func BuildHandler(name string, cfg HandlerConfig) (consumer.Handler, error) {
	handlersMu.RLock()
	f, ok := handlers[name]
	var known []string
	for k := range handlers {
		known = append(known, k)
	}
	handlersMu.RUnlock()
	if !ok {
		sort.Strings(known)
		return nil, fmt.Errorf("CONSUMER_HANDLER=%q: unknown handler; known: %s", name, strings.Join(known, ", "))
	}
	return f(cfg)
}

// Options configure the HTTP handler.
type Options struct {
	// Engine processes the deliveries (required).
	Engine *consumer.Engine
	// DB holds the inbox, for POST /inbox:purge (nil disables it).
	DB consumer.DB
	// InboxRetention is how old inbox rows must be for the purge (192h).
	InboxRetention time.Duration
	// ShipBudget bounds one POST /ledger:ship (45s).
	ShipBudget time.Duration
	// MaxBody bounds a request body (delivery.DefaultMaxBody).
	MaxBody int64
	// Logger receives the structured logs.
	Logger *slog.Logger
}

// Handler is the consume function's HTTP handler.
type Handler struct {
	http.Handler
	close []func(context.Context) error
}

// Close ships the attempts the engine still holds, then closes what the
// handler was built with, in that order, within ctx.
func (h *Handler) Close(ctx context.Context) error {
	var errs []error
	for _, c := range h.close {
		errs = append(errs, c(ctx))
	}
	return errors.Join(errs...)
}

// purgeBatch bounds one purge statement.
const purgeBatch = 5000

// New returns the consume function's HTTP handler. It serves every path
// (it works under http.StripPrefix); only POST is accepted.
func New(o Options) (*Handler, error) {
	if o.Engine == nil {
		return nil, errors.New("consume: Options.Engine is required")
	}
	if o.MaxBody <= 0 {
		o.MaxBody = delivery.DefaultMaxBody
	}
	if o.InboxRetention <= 0 {
		o.InboxRetention = 192 * time.Hour
	}
	if o.ShipBudget <= 0 {
		o.ShipBudget = 45 * time.Second
	}
	if o.Logger == nil {
		o.Logger = logging.Discard()
	}
	h := &Handler{close: []func(context.Context) error{o.Engine.Close}}
	h.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"error": "method " + r.Method + " not allowed: deliveries are POSTed"})
			return
		}
		if strings.HasSuffix(r.URL.Path, "/inbox:purge") && o.DB != nil {
			n := 0
			for {
				d, err := inbox.Purge(r.Context(), o.DB, time.Now().Add(-o.InboxRetention), purgeBatch)
				n += d
				if err != nil {
					o.Logger.ErrorContext(r.Context(), "consume: inbox purge failed", "purged", n, "error", err.Error())
					writeJSON(w, http.StatusInternalServerError, map[string]any{"purged": n, "error": "the purge stopped early; see the logs"})
					return
				}
				if d == 0 {
					break
				}
			}
			o.Logger.InfoContext(r.Context(), "consume: inbox purged", "purged", n, "retention", o.InboxRetention.String())
			writeJSON(w, http.StatusOK, map[string]any{"purged": n})
			return
		}
		if strings.HasSuffix(r.URL.Path, "/ledger:ship") {
			rep, err := o.Engine.Ship(r.Context(), o.ShipBudget)
			if err != nil {
				o.Logger.WarnContext(r.Context(), "consume: shipping attempts to the ledger failed; the next run tries again",
					"shipped", rep.Shipped, "error", err.Error())
				writeJSON(w, http.StatusInternalServerError, map[string]any{"shipped": rep.Shipped, "error": "shipping stopped early; see the logs"})
				return
			}
			if rep.Shipped > 0 {
				o.Logger.InfoContext(r.Context(), "consume: attempts shipped to the ledger late", "shipped", rep.Shipped, "more", rep.More)
			}
			writeJSON(w, http.StatusOK, rep)
			return
		}
		d, err := delivery.Read(r, o.MaxBody)
		if err != nil {
			// Not a Pub/Sub delivery at all: nothing to redeliver or dead-letter.
			o.Logger.ErrorContext(r.Context(), "consume: request is not a Pub/Sub delivery; acknowledged", "error", err.Error())
			writeJSON(w, http.StatusOK, consumer.Result{Code: "malformed_delivery", Error: err.Error()})
			return
		}
		res := o.Engine.Handle(r.Context(), d)
		writeJSON(w, res.Status, res)
	})
	return h, nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
