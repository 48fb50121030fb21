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
// forever. POST /inbox:purge deletes inbox rows older than INBOX_RETENTION
// (for a Scheduler job).
//
// The handler is chosen by name (CONSUMER_HANDLER): projection (latest state
// per aggregate, version-gated), strict (every version in order, then the
// projection), forward (POST each event as a CloudEvent to FORWARD_URL), or
// a name a Go package registered with RegisterHandler.
package consume

import (
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
	// MaxBody bounds a request body (delivery.DefaultMaxBody).
	MaxBody int64
	// Logger receives the structured logs.
	Logger *slog.Logger
}

// New returns the consume function's HTTP handler. It serves every path
// (it works under http.StripPrefix); only POST is accepted.
func New(o Options) (http.Handler, error) {
	if o.Engine == nil {
		return nil, errors.New("consume: Options.Engine is required")
	}
	if o.MaxBody <= 0 {
		o.MaxBody = delivery.DefaultMaxBody
	}
	if o.InboxRetention <= 0 {
		o.InboxRetention = 192 * time.Hour
	}
	if o.Logger == nil {
		o.Logger = logging.Discard()
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"error": "method " + r.Method + " not allowed: deliveries are POSTed"})
			return
		}
		if strings.HasSuffix(r.URL.Path, "/inbox:purge") && o.DB != nil {
			n := 0
			for {
				d, err := inbox.Purge(r.Context(), o.DB, time.Now().Add(-o.InboxRetention), 5000)
				n += d
				if err != nil {
					writeJSON(w, http.StatusInternalServerError, map[string]any{"purged": n, "error": err.Error()})
					return
				}
				if d < 5000 {
					break
				}
			}
			writeJSON(w, http.StatusOK, map[string]any{"purged": n})
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
	}), nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
