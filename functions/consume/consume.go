// Package consume is the consume function: one deployment per consumer
// (CONSUMER_ID), delivered by Eventarc or an ordered push subscription. It
// accepts every request shape Google sends (internal/delivery: Eventarc
// messagePublished in binary or structured mode, wrapped push with
// deliveryAttempt, unwrapped push) and hands each message to the consumer
// engine (shared/consumer): inbox dedup, the configured handler and child
// events in one Postgres transaction, the attempt recorded in the ledger.
//
// Answers: 200 acknowledges (applied, parked by a strict handler,
// duplicate, permanent error recorded, poison dead-lettered, addressed to
// another consumer); 503 asks Pub/Sub to redeliver (transient error,
// dead-lettered after the subscription's maximum attempts; or, for a
// forward consumer, another delivery of the event holds its claim, or its
// circuit breaker holds deliveries back while the target is down: code
// held, a Retry-After header, no attempt counted; see docs/forwarding.md);
// 429 with Retry-After and code flow_limited refuses, without an attempt,
// a delivery over the consumer's flow-control limits that would wait
// longer than CONSUMER_FLOW_WAIT (internal/flow). While an operator has
// paused the consumer by its own flag (Options.Pausable), a delivery is kept in its database and
// answered 200 with code paused, no attempt made (docs/operations.md). It never answers 400: push would redeliver a 400
// forever. The ledger never changes an answer: attempts are committed in
// Postgres with the delivery and recorded afterwards, through rollup
// notices (consume holds no Firestore client nor grant: the rollup writes
// the ledger, the sends of the child events consume kicks included).
//
// In production its tables are migrated by the deploy's migrate step
// (`consume migrate`, MigrateDatabase), which also gives it a Postgres role
// of its own; at start it applies only what is missing (the local stack's
// case) and otherwise only reads relaybus_migrations, so that role needs no
// right to change the schema.
//
// More routes, for Cloud Scheduler jobs: POST /ledger:ship records in
// the ledger the attempts its background shipper missed (every minute),
// POST /inbox:purge deletes inbox rows and shipped attempts older than
// INBOX_RETENTION (daily), and a forward consumer delivered by ordered
// push or Eventarc has POST /breaker:probe (every minute: while its breaker
// keeps it paused, probe the target and resume it once it answers;
// breakerpause.go, breakerflag.go). They answer a JSON report; a failure answers 500
// without the database's details.
//
// The handler is chosen by name (CONSUMER_HANDLER): projection (latest state
// per aggregate, version-gated), strict (every version in order through the
// resequencer, then the projection), forward (POST each event as a signed
// CloudEvent to FORWARD_URL, outside the transaction), or a name a Go
// package registered with RegisterHandler.
//
// A handler that keeps gaps (GapKeeper: strict's projection.Resequencer)
// gets three operator routes, POST and JSON like the others:
//
//	POST /gaps        list the open gaps, oldest first; body optional:
//	                  {"aggregateType", "aggregateId", "limit"}
//	POST /gaps:check  apply parked events whose turn has come and report
//	                  gaps open longer than STRICT_GAP_TIMEOUT (a Scheduler
//	                  job, every minute)
//	POST /gaps:skip   release a gap: {"aggregateType", "aggregateId",
//	                  "version", "through", "reason"} skips the missing
//	                  versions and applies the parked events now next; a
//	                  refusal answers 409 {"code", "message"} with the rule
//
// Other consumers answer 404 there.
package consume

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/relaybus/relaybus/internal/delivery"
	"github.com/relaybus/relaybus/internal/flow"
	"github.com/relaybus/relaybus/internal/inbox"
	"github.com/relaybus/relaybus/internal/logging"
	"github.com/relaybus/relaybus/internal/telemetry"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/forward"
	"github.com/relaybus/relaybus/shared/projection"
	"github.com/relaybus/relaybus/shared/topology"
)

// HandlerConfig is what a handler factory may read.
type HandlerConfig struct {
	// ConsumerID names the consumer.
	ConsumerID string
	// ForwardURL is FORWARD_URL.
	ForwardURL string
	// ForwardAuth is FORWARD_AUTH: none, google or hmac (forward.Auth*).
	ForwardAuth string
	// ForwardAudience is FORWARD_AUDIENCE: the ID tokens' audience with
	// FORWARD_AUTH=google (FORWARD_URL when empty).
	ForwardAudience string
	// ForwardSecrets are FORWARD_SIGNING_SECRET's secrets (space-separated
	// there), with FORWARD_AUTH=hmac.
	ForwardSecrets []string
	// ForwardTimeout is FORWARD_TIMEOUT (forward.DefaultTimeout when 0).
	ForwardTimeout time.Duration
	// ForwardBreaker is the forward handler's circuit breaker
	// (FORWARD_BREAKER_THRESHOLD, FORWARD_BREAKER_COOLDOWN,
	// FORWARD_BREAKER_MAX_COOLDOWN; the defaults when zero).
	ForwardBreaker forward.BreakerOptions
	// ForwardProbe is the request that probes the target while the breaker
	// keeps the consumer's delivery paused (FORWARD_PROBE; HEAD of
	// FORWARD_URL when zero).
	ForwardProbe forward.ProbeRequest
	// ForwardOnTransition is called at each change of the breaker's state
	// (forward.Options.OnTransition): Build pauses a push consumer's
	// subscription from it.
	ForwardOnTransition func(context.Context, forward.Transition)
	// GapTimeout is STRICT_GAP_TIMEOUT: how long a strict consumer's gap
	// may stay open before it is reported (projection.DefaultGapTimeout
	// when 0).
	GapTimeout time.Duration
	// Logger receives the handler's logs.
	Logger *slog.Logger
}

// HandlerConfigFor returns the handler configuration a topology consumer
// declares (its forward_* and gap_timeout_seconds fields); the signing
// secrets are not in the topology (FORWARD_SIGNING_SECRET, from Secret
// Manager): pass them in secrets.
func HandlerConfigFor(c topology.Consumer, secrets []string, log *slog.Logger) HandlerConfig {
	probe, _ := forward.ParseProbe(c.ForwardProbe) // the topology's load checked it
	return HandlerConfig{ForwardProbe: probe, ConsumerID: c.Service, ForwardURL: c.ForwardURL, ForwardAuth: c.ForwardAuth,
		ForwardAudience: c.ForwardAudience, ForwardSecrets: secrets,
		ForwardTimeout: time.Duration(c.ForwardTimeoutSeconds) * time.Second,
		ForwardBreaker: forward.BreakerOptions{Threshold: c.ForwardBreakerThreshold,
			CoolDown:    time.Duration(c.ForwardBreakerCoolDownSeconds) * time.Second,
			MaxCoolDown: time.Duration(c.ForwardBreakerMaxCoolDownSeconds) * time.Second},
		GapTimeout: time.Duration(c.GapTimeoutSeconds) * time.Second, Logger: log}
}

// HandlerFactory builds a named handler.
type HandlerFactory func(HandlerConfig) (consumer.Handler, error)

var (
	handlersMu sync.RWMutex
	handlers   = map[string]HandlerFactory{
		"projection": func(HandlerConfig) (consumer.Handler, error) { return projection.Latest(), nil },
		"strict": func(c HandlerConfig) (consumer.Handler, error) {
			return projection.NewStrict(projection.Latest(), projection.StrictOptions{GapTimeout: c.GapTimeout, Logger: c.Logger}), nil
		},
		"forward": func(c HandlerConfig) (consumer.Handler, error) {
			return forward.New(forward.Options{URL: c.ForwardURL, Auth: c.ForwardAuth, Audience: c.ForwardAudience,
				Secrets: c.ForwardSecrets, Timeout: c.ForwardTimeout, Breaker: c.ForwardBreaker, Name: c.ConsumerID, Logger: c.Logger,
				Probe: c.ForwardProbe, OnTransition: c.ForwardOnTransition})
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
	// InboxRetention is how old inbox rows must be for the purge
	// (DefaultInboxRetention).
	InboxRetention time.Duration
	// ShipBudget bounds one POST /ledger:ship (45s).
	ShipBudget time.Duration
	// Flow are the consumer's flow-control limits (the zero value: none):
	// a delivery held back longer than Flow.MaxWait is answered 429 with
	// Retry-After, no attempt made or counted.
	Flow FlowLimits
	// MaxBody bounds a request body (delivery.DefaultMaxBody).
	MaxBody int64
	// Logger receives the structured logs.
	Logger *slog.Logger
	// Pausable turns on the consumer's own delivery control, read from
	// DB (the operators' pause of a consumer whose broker has none:
	// Eventarc, pull, NATS; see docs/operations.md): while the consumer
	// is paused on a delivery's topic, the delivery is kept in its
	// database and acknowledged, 200 with code paused, and no attempt is
	// made or counted; resuming publishes the kept deliveries again.
	Pausable bool
	// PauseEvery is how often the pause flag is read, so how long a
	// pause takes to reach this process (one statement each time; 1s
	// when zero).
	PauseEvery time.Duration
}

// topicAttr names a message's topic when its delivery does not (the
// envelope's extension, binary mode).
const topicAttr = "topic"

// CodePaused is the answer's code for a delivery kept while its consumer
// is paused.
const CodePaused = "paused"

// GapKeeper is a handler that holds events until their predecessor is
// applied (projection.Resequencer, CONSUMER_HANDLER=strict): consume serves
// its gaps at POST /gaps, /gaps:check and /gaps:skip.
type GapKeeper interface {
	Gaps(ctx context.Context, run projection.Runner, f projection.GapFilter) ([]projection.Gap, error)
	Check(ctx context.Context, run projection.Runner) (projection.CheckReport, error)
	Skip(ctx context.Context, run projection.Runner, req projection.SkipRequest) (projection.SkipResult, error)
	GapTimeout() time.Duration
}

// Handler is the consume function's HTTP handler.
type Handler struct {
	http.Handler
	close  []func(context.Context) error
	pauses *inbox.PauseFlags // nil unless Options.Pausable
	// gate holds deliveries to Options.Flow (nil: no limits), for the
	// pull worker's engine too.
	gate *flow.Gate
	// breaker pauses a push consumer's subscription while its forward
	// target is down (Build; nil: POST /breaker:probe answers 404).
	breaker *breakerPause
	// flag pauses an Eventarc forward consumer by its own flag while its
	// target is down (Build; nil: none).
	flag *breakerFlag
}

// FlowLimits are a consumer's flow-control limits in one consume
// instance (internal/flow); zero or less is no limit.
type FlowLimits struct {
	// MaxInFlight is the most deliveries handled at once
	// (CONSUMER_MAX_IN_FLIGHT).
	MaxInFlight int
	// MaxPerSecond is the most deliveries handled per second
	// (CONSUMER_MAX_PER_SECOND).
	MaxPerSecond float64
	// MaxWait bounds how long a delivery waits for its turn before it is
	// refused (CONSUMER_FLOW_WAIT); 0 waits as long as its request.
	MaxWait time.Duration
	// ReportEvery is how often the instance writes its flow report to
	// Options.DB (relaybus_inbox_flow, which the operators' console reads
	// to show whether the consumer is at its limits) when it was at a
	// limit since the last one (DefaultFlowReportEvery when 0).
	ReportEvery time.Duration
}

func (l FlowLimits) set() bool { return l.MaxInFlight > 0 || l.MaxPerSecond > 0 }

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

// DefaultInboxRetention is how old inbox rows must be for the purge when
// Options give no InboxRetention, and INBOX_RETENTION's default (Config's
// tag; internal/instance's TestEachDefaultIsWrittenOnce ties the two).
const DefaultInboxRetention = 192 * time.Hour

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
		o.InboxRetention = DefaultInboxRetention
	}
	if o.ShipBudget <= 0 {
		o.ShipBudget = 45 * time.Second
	}
	if o.Logger == nil {
		o.Logger = logging.Discard()
	}
	h := &Handler{close: []func(context.Context) error{o.Engine.Close}}
	var pauses *inbox.PauseFlags
	if o.Pausable && o.DB != nil {
		pauses = &inbox.PauseFlags{DB: o.DB, ConsumerID: o.Engine.ConsumerID(), Every: o.PauseEvery}
	}
	h.pauses = pauses
	if g, ok := o.Engine.Handler().(GapKeeper); ok {
		// A strict consumer's gaps as gauges (with telemetry on), read at
		// each metric collection.
		unobserve := telemetry.ObserveGaps(o.Engine.ConsumerID(), func(ctx context.Context) (time.Duration, int, error) {
			gs, err := g.Gaps(ctx, o.Engine, projection.GapFilter{})
			if err != nil || len(gs) == 0 {
				return 0, 0, err
			}
			age, perr := time.ParseDuration(gs[0].Age) // by the resequencer's clock, to the second
			if perr != nil {
				age = time.Since(gs[0].Since)
			}
			return age, len(gs), nil
		})
		h.close = append(h.close, func(context.Context) error { return unobserve() })
	}
	if b, ok := o.Engine.Handler().(interface{ BreakerState() forward.State }); ok {
		// A forward consumer's circuit breaker as a gauge (with telemetry
		// on), read at each metric collection.
		unobserve := telemetry.ObserveBreaker(o.Engine.ConsumerID(), func() int64 { return int64(b.BreakerState()) })
		h.close = append(h.close, func(context.Context) error { return unobserve() })
	}
	if o.Flow.set() {
		h.gate = flow.New(flow.Options{MaxInFlight: o.Flow.MaxInFlight, PerSecond: o.Flow.MaxPerSecond, MaxWait: o.Flow.MaxWait})
		// The consumer's flow control (with telemetry on), read at each
		// metric collection.
		gate := h.gate
		unobserve := telemetry.ObserveFlow(o.Engine.ConsumerID(), func() (int64, bool, int64) {
			s := gate.State()
			return s.InFlight, s.AtLimit, s.Refused
		})
		h.close = append(h.close, func(context.Context) error { return unobserve() })
		if o.DB != nil {
			every := o.Flow.ReportEvery
			if every <= 0 {
				every = DefaultFlowReportEvery
			}
			rctx, stop := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				defer close(done)
				reportFlow(rctx, o.DB, o.Engine.ConsumerID(), gate, every, o.Logger)
			}()
			h.close = append(h.close, func(context.Context) error { stop(); <-done; return nil })
		}
	}
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
		if p := r.URL.Path; strings.HasSuffix(p, "/gaps") || strings.HasSuffix(p, "/gaps:check") || strings.HasSuffix(p, "/gaps:skip") {
			serveGaps(w, r, o)
			return
		}
		if strings.HasSuffix(r.URL.Path, "/breaker:probe") {
			if h.flag != nil {
				h.flag.serveProbe(w, r, o.Logger)
				return
			}
			h.breaker.serveProbe(w, r, o.Logger)
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
		if pauses != nil {
			if kept, err := hold(r.Context(), pauses, d); err != nil {
				o.Logger.WarnContext(r.Context(), "consume: cannot keep a delivery while paused; redelivery requested", "error", err.Error())
				writeJSON(w, http.StatusServiceUnavailable, consumer.Result{Code: "database", Error: "the consumer's database is unavailable"})
				return
			} else if kept {
				writeJSON(w, http.StatusOK, consumer.Result{Code: CodePaused, EventID: d.Message.Attributes["event_id"],
					Error: "the consumer is paused: the delivery is kept and published again when it resumes"})
				return
			}
		}
		release, err := h.gate.Acquire(r.Context())
		if err != nil {
			var le *flow.LimitError
			if !errors.As(err, &le) {
				// The request ended while it waited: nobody reads the answer.
				writeJSON(w, http.StatusServiceUnavailable, consumer.Result{Code: CodeFlowLimited, Error: err.Error()})
				return
			}
			w.Header().Set("Retry-After", strconv.Itoa(flow.RetryAfterSeconds(le.RetryAfter)))
			writeJSON(w, http.StatusTooManyRequests, consumer.Result{Code: CodeFlowLimited, Error: le.Error()})
			return
		}
		defer release()
		res := o.Engine.Handle(r.Context(), d)
		if res.Held() {
			// Pub/Sub's push ignores it (its retry policy spaces the
			// redeliveries); it tells anyone else who posts deliveries.
			w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(res.RetryAfter.Seconds()))))
			if h.breaker != nil {
				h.breaker.held(r.Context())
			}
			if h.flag != nil {
				h.flag.held(r.Context())
			}
		}
		writeJSON(w, res.Status, res)
	})
	return h, nil
}

// hold keeps d if the consumer is paused on its topic (the flag as last
// read, then checked again by the insert itself, so nothing is kept once
// the pause is gone).
func hold(ctx context.Context, pauses *inbox.PauseFlags, d delivery.Delivery) (bool, error) {
	topic := d.Topic()
	if topic == "" {
		topic = d.Message.Attributes[topicAttr]
	}
	// A flag that could not be read counts as not paused: the delivery
	// goes to the engine, which meets the same database.
	if paused, _ := pauses.Paused(ctx, topic); !paused {
		return false, nil
	}
	return inbox.Hold(ctx, pauses.DB, pauses.ConsumerID, topic, d.Message)
}

// CodeFlowLimited is the code of a delivery the consumer's flow control
// held back (429 with Retry-After on push; held, no attempt, on pull).
const CodeFlowLimited = "flow_limited"

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// maxGapBody bounds an operator's request body.
const maxGapBody = 64 << 10

// serveGaps serves a GapKeeper's routes.
func serveGaps(w http.ResponseWriter, r *http.Request, o Options) {
	g, ok := o.Engine.Handler().(GapKeeper)
	if !ok {
		writeJSON(w, http.StatusNotFound, map[string]string{"code": "no_gaps",
			"message": "this consumer's handler keeps no gaps (CONSUMER_HANDLER=strict does)"})
		return
	}
	ctx := r.Context()
	body, err := io.ReadAll(io.LimitReader(r.Body, maxGapBody))
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"code": "invalid", "message": err.Error()})
		return
	}
	decode := func(v any) bool {
		if len(bytes.TrimSpace(body)) == 0 {
			return true
		}
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(v); err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"code": "invalid", "message": "the body is not the route's JSON: " + err.Error()})
			return false
		}
		return true
	}
	failed := func(what string, err error) {
		var ge *projection.GapError
		if errors.As(err, &ge) {
			writeJSON(w, http.StatusConflict, map[string]string{"code": ge.Code, "message": ge.Message})
			return
		}
		o.Logger.ErrorContext(ctx, "consume: "+what+" failed", "error", err.Error())
		writeJSON(w, http.StatusInternalServerError, map[string]string{"code": "internal", "message": what + " failed; see the logs"})
	}
	switch {
	case strings.HasSuffix(r.URL.Path, "/gaps:check"):
		rep, err := g.Check(ctx, o.Engine)
		if err != nil {
			failed("the gap check", err)
			return
		}
		writeJSON(w, http.StatusOK, rep)
	case strings.HasSuffix(r.URL.Path, "/gaps:skip"):
		var req projection.SkipRequest
		if !decode(&req) {
			return
		}
		req.By = caller(r)
		res, err := g.Skip(ctx, o.Engine, req)
		if err != nil {
			failed("the skip", err)
			return
		}
		writeJSON(w, http.StatusOK, res)
	default:
		var f projection.GapFilter
		if !decode(&f) {
			return
		}
		gaps, err := g.Gaps(ctx, o.Engine, f)
		if err != nil {
			failed("listing gaps", err)
			return
		}
		if gaps == nil {
			gaps = []projection.Gap{}
		}
		writeJSON(w, http.StatusOK, map[string]any{"gaps": gaps, "gapTimeout": g.GapTimeout().String()})
	}
}

// caller names who made an operator's request: the email in the ID token
// Cloud Run verified before handing the request on (with the signature
// stripped: its claims are read, not verified again), else "anonymous".
func caller(r *http.Request) string {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return "anonymous"
	}
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return "anonymous"
	}
	b, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return "anonymous"
	}
	var claims struct {
		Email string `json:"email"`
		Sub   string `json:"sub"`
	}
	if json.Unmarshal(b, &claims) != nil {
		return "anonymous"
	}
	if claims.Email != "" {
		return claims.Email
	}
	if claims.Sub != "" {
		return claims.Sub
	}
	return "anonymous"
}
