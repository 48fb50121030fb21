package publish

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"go.opentelemetry.io/otel/attribute"

	"github.com/relaybus/relaybus/internal/identity"
	"github.com/relaybus/relaybus/internal/logging"
	"github.com/relaybus/relaybus/internal/migrate"
	"github.com/relaybus/relaybus/internal/names"
	"github.com/relaybus/relaybus/internal/ratelimit"
	"github.com/relaybus/relaybus/internal/registry"
	"github.com/relaybus/relaybus/internal/schema"
	"github.com/relaybus/relaybus/internal/telemetry"
	"github.com/relaybus/relaybus/internal/traceparent"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/postgres"
	"github.com/relaybus/relaybus/shared/relay"
	"github.com/relaybus/relaybus/shared/topology"
)

// DB is what the handler needs of Postgres (a *pgxpool.Pool): the outbox
// write is one statement.
type DB = postgres.DBTX

// FastPath publishes outbox rows at once, through the relay's own
// claim/publish/mark code ((*relay.Relay).PublishNow). It returns each id's
// state afterwards: published, or pending when it could not (blocked behind
// an earlier version of its aggregate, leased by another relay, publish
// failed and a retry is scheduled). It never breaks per-aggregate order.
type FastPath interface {
	PublishNow(ctx context.Context, ids ...string) (map[string]outbox.State, error)
}

// Enqueuer is a FastPath that also writes the outbox rows and takes the
// fast path's lease on their aggregates in the same statement
// ((*relay.Relay).EnqueueNow), then publishes that claim (PublishClaimed):
// one statement for the write and the lease, where a transaction around
// outbox.Enqueue then PublishNow take four. The handler uses it when its
// FastPath has it.
type Enqueuer interface {
	EnqueueNow(ctx context.Context, events ...*event.Event) ([]outbox.Enqueued, *relay.Claim, error)
	PublishClaimed(ctx context.Context, c *relay.Claim) (map[string]outbox.State, error)
}

// Defaults of Options.
const (
	// DefaultMaxBatchEvents is the most events one batch request may carry.
	DefaultMaxBatchEvents = 500
	// DefaultBudget bounds a request: the outbox write, then the fast path
	// with what is left; an event the fast path did not publish in time is
	// answered pending and left to the relay.
	DefaultBudget = 2 * time.Second
	// DefaultMaxInFlight is how many requests are served at once; one more
	// waits at most admissionWait, then is answered 503 with Retry-After.
	DefaultMaxInFlight = 256
	// DefaultRateLimit is the requests per second one caller may make
	// (per instance), and DefaultRateBurst how many at once: room for a
	// producer sending batches at full speed, a ceiling for one that
	// loops.
	DefaultRateLimit = 200
	DefaultRateBurst = 400
	// admissionWait is how long a request waits for a slot.
	admissionWait = 100 * time.Millisecond
	// bodyOverhead is what a body may hold besides one payload: the
	// envelope's other fields, or the CloudEvent's attributes.
	bodyOverhead = 64 << 10
)

// DefaultMaxBodyBytes is the request body limit for a payload limit: one
// payload base64-encoded (how a binary payload travels in structured mode)
// plus 64 KiB for the rest of the event. A batch shares the same limit.
func DefaultMaxBodyBytes(payloadLimit int) int64 {
	return int64(base64.StdEncoding.EncodedLen(payloadLimit)) + bodyOverhead
}

// Options configure a Handler. DB and Registry are required.
type Options struct {
	// DB holds the outbox (migrated by outbox.Migrate).
	DB DB
	// Registry says which consumers expect a topic's events; a topic with
	// none is skipped: an event nobody would consume is not sent. Put registry.Cached in
	// front of a remote registry.
	Registry registry.Registry
	// FastPath, when set, publishes each accepted event at once; nil leaves
	// every accepted event pending for the scheduled relay.
	FastPath FastPath
	// Budget bounds one request, whatever Postgres, Pub/Sub and Firestore
	// do (DefaultBudget when zero): an outbox write that does not finish in
	// it answers 503 (nothing or the whole request was written: retry with
	// the same eventIds), an event the fast path did not publish in it
	// answers 202 pending.
	Budget time.Duration
	// MaxInFlight bounds the requests served at once (DefaultMaxInFlight);
	// beyond it a request is answered 503 with Retry-After.
	MaxInFlight int
	// MaxPayloadBytes is the payload limit (event.DefaultPayloadLimit, 1 MiB,
	// when zero). Larger than event.MaxPayloadLimit is an error, unless
	// ClaimCheck is set: then up to event.MaxClaimCheckPayload (32 MiB).
	MaxPayloadBytes int
	// ClaimCheck says the deployment's relays (this function's fast path
	// and the relay function) publish a message over their threshold by
	// claim check: a payload may then be larger than a broker message
	// (docs/producing.md, "Large payloads").
	ClaimCheck bool
	// MaxBodyBytes is the request body limit (DefaultMaxBodyBytes of the
	// payload limit when zero).
	MaxBodyBytes int64
	// MaxBatchEvents caps the events of one batch (DefaultMaxBatchEvents
	// when zero).
	MaxBatchEvents int
	// Logger receives the structured logs (logging.Discard when nil).
	Logger *slog.Logger
	// Now is the clock for a missing occurredAt (time.Now when nil).
	Now func() time.Time
	// Auth is AuthCloudRun or AuthNone (the default, a local stack): with
	// AuthCloudRun every request names its caller by the ID token Cloud
	// Run verified (internal/identity), checked again for issuer, expiry and
	// Audiences, the events' initiator service is recorded from it, and
	// Publishers is enforced. AuthCloudRun is refused unless OnCloudRun:
	// anywhere else nobody verified the tokens it reads.
	Auth string
	// Audiences, with AuthCloudRun, are the audiences a token may have
	// (PUBLISH_AUDIENCE: the service's URLs); empty checks none.
	Audiences []string
	// OnCloudRun says the process runs on Cloud Run (K_SERVICE is set).
	OnCloudRun bool
	// Publishers are the callers allowed per topic (topology publishers
	// and PUBLISH_PUBLISHERS, lower-cased emails). Closed by default: with
	// AuthCloudRun a topic not listed, or listed empty, takes nobody.
	Publishers map[string][]string
	// RateLimit and RateBurst limit each caller's requests per second
	// (PUBLISH_RATE_LIMIT, PUBLISH_RATE_BURST; DefaultRateLimit and
	// DefaultRateBurst when zero, off when RateLimit is negative): past
	// them a request is answered 429 with Retry-After, nothing written.
	// A caller is its verified identity, or its address without one.
	RateLimit float64
	RateBurst int
	// Topology, when set, binds aggregate types to topics
	// (topology.Topic.OwnedAggregateTypes): an event whose aggregateType
	// its topic does not carry is refused 400, nothing written, so a
	// producer allowed on one topic cannot take another topic's aggregate
	// versions. Build sets it; nil checks nothing.
	Topology *topology.Topology
	// Schemas are the topology's payload schemas (internal/schema): an event
	// whose payload breaks its topic's schema for its schemaVersion, or
	// names a version the topic does not declare, is refused 400 with the
	// field and the rule, nothing written. Nil checks nothing.
	Schemas *schema.Set
}

// Auth modes (PUBLISH_AUTH).
const (
	AuthNone     = "none"
	AuthCloudRun = "cloudrun"
)

// Handler is the publish function's HTTP handler. It serves every path it
// is given, so it works at a service root and under http.StripPrefix.
type Handler struct {
	db         DB
	reg        registry.Registry
	fast       FastPath
	budget     time.Duration
	slots      chan struct{}
	limits     event.Limits
	maxBody    int64
	maxBatch   int
	log        *slog.Logger
	now        func() time.Time
	maxPayload int
	auth       string
	publishers map[string]map[string]bool
	schemas    *schema.Set
	top        *topology.Topology
	cloudRun   identity.CloudRun
	limiter    *ratelimit.Limiter
}

// New returns the publish handler over the given dependencies.
func New(opts Options) (*Handler, error) {
	if opts.DB == nil {
		return nil, errors.New("publish: Options.DB is required")
	}
	if opts.Registry == nil {
		return nil, errors.New("publish: Options.Registry is required")
	}
	if limit := event.MaxPayloadLimit; !opts.ClaimCheck && (opts.MaxPayloadBytes < 0 || opts.MaxPayloadBytes > limit) {
		return nil, fmt.Errorf("publish: the payload limit must be 1 to %d bytes (got %d; up to %d with a claim check)", limit, opts.MaxPayloadBytes, event.MaxClaimCheckPayload)
	}
	if limit := event.MaxClaimCheckPayload; opts.ClaimCheck && (opts.MaxPayloadBytes < 0 || opts.MaxPayloadBytes > limit) {
		return nil, fmt.Errorf("publish: the payload limit must be 1 to %d bytes with a claim check (got %d)", limit, opts.MaxPayloadBytes)
	}
	h := &Handler{
		db: opts.DB, reg: opts.Registry, fast: opts.FastPath, budget: opts.Budget,
		limits: event.Limits{MaxPayloadBytes: opts.MaxPayloadBytes, ClaimCheck: opts.ClaimCheck}, maxBody: opts.MaxBodyBytes,
		maxBatch: opts.MaxBatchEvents, log: opts.Logger, now: opts.Now, schemas: opts.Schemas, top: opts.Topology,
	}
	h.maxPayload = h.limits.PayloadLimit()
	switch opts.Auth {
	case "", AuthNone:
		h.auth = AuthNone
	case AuthCloudRun:
		if !opts.OnCloudRun {
			return nil, errors.New("publish: PUBLISH_AUTH=cloudrun reads the caller from the ID token Cloud Run's IAM verified, so it runs only on Cloud Run (K_SERVICE is not set); use none on a local stack")
		}
		h.auth = AuthCloudRun
		h.cloudRun = identity.CloudRun{Audiences: opts.Audiences}
	default:
		return nil, fmt.Errorf("publish: PUBLISH_AUTH=%q: want cloudrun (behind Cloud Run IAM) or none", opts.Auth)
	}
	h.publishers = map[string]map[string]bool{}
	for topic, ps := range opts.Publishers {
		for _, p := range ps {
			if _, rest, ok := strings.Cut(p, ":"); ok {
				p = rest
			}
			if p = strings.ToLower(strings.TrimSpace(p)); p == "" {
				continue
			}
			if h.publishers[topic] == nil {
				h.publishers[topic] = map[string]bool{}
			}
			h.publishers[topic][p] = true
		}
	}
	switch {
	case opts.RateLimit < 0:
	case opts.RateLimit == 0:
		h.limiter = ratelimit.New(ratelimit.Options{Rate: DefaultRateLimit, Burst: DefaultRateBurst})
	default:
		h.limiter = ratelimit.New(ratelimit.Options{Rate: opts.RateLimit, Burst: opts.RateBurst})
	}
	if h.budget <= 0 {
		h.budget = DefaultBudget
	}
	if opts.MaxInFlight <= 0 {
		opts.MaxInFlight = DefaultMaxInFlight
	}
	h.slots = make(chan struct{}, opts.MaxInFlight)
	if h.maxBody <= 0 {
		h.maxBody = DefaultMaxBodyBytes(h.maxPayload)
	}
	if h.maxBatch <= 0 {
		h.maxBatch = DefaultMaxBatchEvents
	}
	if h.log == nil {
		h.log = logging.Discard()
	}
	if h.now == nil {
		h.now = time.Now
	}
	return h, nil
}

// Statuses in a Result.
const (
	// StatusPublished: Pub/Sub has the event.
	StatusPublished = string(outbox.StatePublished)
	// StatusPending: the event is in the outbox; the relay publishes it.
	StatusPending = string(outbox.StatePending)
	// StatusFailed: only for a duplicate whose earlier row exhausted its
	// publish attempts and waits for an operator.
	StatusFailed = string(outbox.StateFailed)
	// StatusSkipped: the topic has no enabled consumer, so nothing was
	// recorded or published; the reason says so.
	StatusSkipped = "SKIPPED"
)

// Result is the answer for one event.
type Result struct {
	EventID string `json:"eventId"`
	// Status is published, pending, failed (a duplicate only) or SKIPPED.
	Status string `json:"status"`
	// Duplicate is true when the outbox already held this eventId: nothing
	// was written and Status is that row's state.
	Duplicate   bool   `json:"duplicate"`
	Topic       string `json:"topic"`
	AggregateID string `json:"aggregateId"`
	Version     int64  `json:"version"`
	// TraceID is the event's trace id, generated when the request had none.
	TraceID string `json:"traceId"`
	// Reason says why an event was SKIPPED.
	Reason string `json:"reason,omitempty"`
	// LastError is the last publish error of a row that is not published.
	LastError string `json:"lastError,omitempty"`
	// DeliverAt is when a scheduled event is due (absent: not scheduled).
	DeliverAt time.Time `json:"deliverAt,omitzero"`
}

// BatchResponse answers a batch request: one result per event, in order.
type BatchResponse struct {
	Results []Result `json:"results"`
}

// Error codes in an ErrorResponse.
const (
	CodeInvalid              = "invalid_event"          // 400
	CodeMalformed            = "malformed"              // 400
	CodeTooLarge             = "too_large"              // 413
	CodeUnsupportedMediaType = "unsupported_media_type" // 415
	CodeMethodNotAllowed     = "method_not_allowed"     // 405
	CodeVersionConflict      = "version_conflict"       // 409
	CodeEventIDConflict      = "event_id_conflict"      // 409
	CodeUnavailable          = "unavailable"            // 503
	CodeBusy                 = "busy"                   // 503
	CodeUnauthenticated      = "unauthenticated"        // 401
	CodeForbidden            = "forbidden"              // 403
	CodeRateLimited          = "rate_limited"           // 429
)

// ErrorResponse is the body of every 4xx and 5xx answer.
type ErrorResponse struct {
	// Error is a stable code (Code* constants).
	Error string `json:"error"`
	// Message says what was wrong, naming every field and its rule.
	Message string `json:"message"`
	// Fields lists each field that broke a rule.
	Fields []FieldProblem `json:"fields,omitempty"`
	// Topic and Caller name, in a 403, the topic the caller may not write.
	Topic  string `json:"topic,omitempty"`
	Caller string `json:"caller,omitempty"`
}

// FieldProblem is one field of one event that broke one rule.
type FieldProblem struct {
	// Index is the event's position in a batch (absent for a single event).
	Index *int `json:"index,omitempty"`
	// EventID is the event's id when it had one.
	EventID string `json:"eventId,omitempty"`
	// Field is the field's name in the plain envelope's spelling
	// (aggregateId, initiator.userId, ...).
	Field string `json:"field"`
	// Rule is what the field must be.
	Rule string `json:"rule"`
}

// ServeHTTP handles one publish request. With telemetry on, the request is
// a server span (continuing the caller's traceparent header, sampled by
// relaybus's own policy), under which the outbox rows are written (they
// keep its context) and the fast path publishes; its duration is recorded
// by status.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !telemetry.Enabled() {
		h.serve(w, r)
		return
	}
	start := time.Now()
	ctx, span := telemetry.Start(r.Context(), "publish", telemetry.KindServer, r.Header.Get("traceparent"),
		attribute.String("http.request.method", r.Method))
	sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
	h.serve(sw, r.WithContext(ctx))
	span.SetAttributes(telemetry.KeyStatus.Int(sw.status))
	if sw.status >= 500 {
		span.Fail(http.StatusText(sw.status))
	}
	span.End(nil)
	telemetry.RecordPublishRequest(ctx, sw.status, time.Since(start))
}

// statusWriter remembers the status a handler answered.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

func (h *Handler) serve(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	select {
	case h.slots <- struct{}{}:
	default:
		t := time.NewTimer(admissionWait)
		select {
		case h.slots <- struct{}{}:
			t.Stop()
		case <-t.C:
			w.Header().Set("Retry-After", "1")
			h.fail(w, r, "", http.StatusServiceUnavailable, ErrorResponse{Error: CodeBusy,
				Message: "publish is at its limit of requests in flight; nothing was written, retry after a second"})
			return
		}
	}
	defer func() { <-h.slots }()
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		h.fail(w, r, "", http.StatusMethodNotAllowed, ErrorResponse{Error: CodeMethodNotAllowed,
			Message: "method " + r.Method + " is not allowed; publish with POST"})
		return
	}
	// Who is calling, and whether they may call again now, before the
	// body is read.
	var caller *identity.Caller
	key := clientAddr(r)
	if h.auth == AuthCloudRun {
		c, err := h.cloudRun.Caller(r)
		if err != nil {
			h.fail(w, r, "", http.StatusUnauthorized, ErrorResponse{Error: CodeUnauthenticated,
				Message: "the caller's identity: " + err.Error() + " (publish runs behind Cloud Run IAM, which verifies the ID token)"})
			return
		}
		caller, key = &c, c.Name()
	}
	if ok, wait := h.limiter.Allow(key); !ok {
		ratelimit.RetryAfter(w.Header(), wait)
		resp := ErrorResponse{Error: CodeRateLimited,
			Message: fmt.Sprintf("%s sends more than %g requests per second (PUBLISH_RATE_LIMIT); nothing was written, retry after %s", key, h.limiterRate(), w.Header().Get("Retry-After")+"s")}
		if caller != nil {
			resp.Caller = caller.Name()
		}
		h.fail(w, r, "", http.StatusTooManyRequests, resp)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.maxBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			h.fail(w, r, "", http.StatusRequestEntityTooLarge, ErrorResponse{Error: CodeTooLarge,
				Message: fmt.Sprintf("body: at most %d bytes", h.maxBody)})
			return
		}
		h.fail(w, r, "", http.StatusBadRequest, ErrorResponse{Error: CodeMalformed, Message: "body: cannot be read: " + err.Error()})
		return
	}
	d, rerr := decode(r.Context(), r.Header, body, h.maxBatch)
	if rerr != nil {
		h.fail(w, r, "", rerr.status, ErrorResponse{Error: rerr.code, Message: rerr.msg})
		return
	}
	if caller != nil {
		for i := range d.items {
			if it := &d.items[i]; !it.whole && !h.publishers[it.ev.Topic][caller.Email] {
				why := "the topology lists its publishers (infra/topology.yaml publishers, or PUBLISH_PUBLISHERS)"
				if len(h.publishers[it.ev.Topic]) == 0 {
					why = "it declares no publishers, so nobody may publish to it (infra/topology.yaml publishers, or PUBLISH_PUBLISHERS)"
				}
				h.fail(w, r, d.mode, http.StatusForbidden, ErrorResponse{Error: CodeForbidden, Topic: it.ev.Topic, Caller: caller.Name(),
					Message: fmt.Sprintf("%s may not publish to topic %s: %s; nothing was written", caller.Name(), it.ev.Topic, why)})
				return
			}
		}
	}
	events, problems, tooLarge := h.prepare(r, d, caller)
	if len(problems) > 0 {
		status, code := http.StatusBadRequest, CodeInvalid
		if tooLarge {
			status, code = http.StatusRequestEntityTooLarge, CodeTooLarge
		}
		h.fail(w, r, d.mode, status, ErrorResponse{Error: code, Message: problemsMessage(problems, d.batch), Fields: problems})
		return
	}

	results, status, errResp := h.accept(r.Context(), start.Add(h.budget), d.mode, events)
	if errResp != nil {
		if status == http.StatusServiceUnavailable {
			w.Header().Set("Retry-After", "1")
		}
		h.fail(w, r, d.mode, status, *errResp)
		return
	}
	if d.batch {
		writeJSON(w, status, BatchResponse{Results: results})
		return
	}
	writeJSON(w, status, results[0])
}

// prepare fills, normalizes and validates every event of the request and
// checks a batch for repeated ids and aggregate versions. It returns the
// events, or every problem found (tooLarge when one of them is a size limit).
func (h *Handler) prepare(r *http.Request, d *decoded, caller *identity.Caller) ([]*event.Event, []FieldProblem, bool) {
	now := h.now()
	header, headerOK := parseTraceparent(r.Header.Get("traceparent"))
	reqID := requestID(r.Header)
	events := make([]*event.Event, len(d.items))
	var problems []FieldProblem
	tooLarge := false
	add := func(i int, id string, fes []*event.FieldError) {
		for _, fe := range fes {
			p := FieldProblem{EventID: id, Field: fe.Field, Rule: fe.Rule}
			if d.batch {
				p.Index = &i
			}
			problems = append(problems, p)
			if errors.Is(fe, event.ErrTooLarge) {
				tooLarge = true
			}
		}
	}
	for i := range d.items {
		it := &d.items[i]
		e := &it.ev
		if it.whole {
			add(i, "", it.errs)
			continue
		}
		if e.TraceID == "" {
			tc, ok := parseTraceparent(it.traceparent)
			if !ok {
				tc, ok = header, headerOK
			}
			if ok {
				e.TraceID = tc.traceID
				if e.SpanID == "" {
					e.SpanID = tc.spanID
				}
			} else if tp := traceparent.FromContext(r.Context()); tp != "" {
				// The request span's trace: the event's trace id is the one
				// Cloud Trace shows.
				e.TraceID = tp[3:35]
			}
		}
		// The initiator can always be shown (the ledger answers who caused
		// every event): the
		// service Cloud Run verified when it is known (not what the body
		// claims), else what the request says of it, else the source
		// service; and the request's id.
		if caller != nil {
			e.Initiator.Service = caller.Service()
		}
		if e.Initiator.Service == "" {
			e.Initiator.Service = e.Source
		}
		if e.Initiator.ClientRequestID == "" {
			e.Initiator.ClientRequestID = reqID
		}
		err := e.Prepare(now, h.limits)
		// Decoding problems first; validation adds only fields decoding did
		// not already report (a version that failed to parse is not also
		// "required").
		fes := it.errs
		seen := make(map[string]bool, len(fes))
		for _, fe := range fes {
			seen[fe.Field] = true
		}
		for _, fe := range event.FieldErrors(err) {
			if !seen[fe.Field] {
				fes = append(fes, fe)
			}
		}
		if len(fes) == 0 {
			fes = h.checkTopic(e)
		}
		if len(fes) == 0 {
			// The topic's schema, once the event itself is sound.
			fes = event.FieldErrors(h.schemas.Check(e))
		}
		add(i, e.ID, fes)
		events[i] = e
	}
	if len(problems) == 0 && len(events) > 1 {
		type aggVersion struct {
			typ, id string
			v       int64
		}
		ids := make(map[string]int, len(events))
		versions := make(map[aggVersion]int, len(events))
		for i, e := range events {
			if j, ok := ids[e.ID]; ok {
				add(i, e.ID, []*event.FieldError{{Field: "eventId", Rule: "must be unique within the batch (event " + strconv.Itoa(j) + " has it too)"}})
			} else {
				ids[e.ID] = i
			}
			k := aggVersion{e.AggregateType, e.AggregateID, e.Version}
			if j, ok := versions[k]; ok {
				add(i, e.ID, []*event.FieldError{{Field: "version", Rule: "must be unique per aggregate within the batch (event " + strconv.Itoa(j) + " has the same aggregate and version)"}})
			} else {
				versions[k] = i
			}
		}
	}
	return events, problems, tooLarge
}

// checkTopic applies the topic rules to a sound event: no dead-letter
// topic, and an aggregate type the topic carries.
func (h *Handler) checkTopic(e *event.Event) []*event.FieldError {
	if names.IsDeadLetter(e.Topic) {
		return []*event.FieldError{{Field: "topic", Rule: "must not be a dead-letter topic (<topic>" + names.DeadLetterSuffix + "): dead letters come from Pub/Sub's dead-lettering and are replayed through the operations API"}}
	}
	if h.top == nil {
		return nil
	}
	var owned []string
	if tp := h.top.Topic(e.Topic); tp != nil {
		owned = tp.OwnedAggregateTypes()
	} else if segs := strings.Split(e.Topic, "."); len(segs) >= 2 {
		// A topic the topology does not declare carries its aggregate
		// segment, unless a declared topic carries that type.
		if _, declared := h.top.AggregateTopic(segs[1]); !declared {
			owned = segs[1:2]
		}
	}
	if slices.Contains(owned, e.AggregateType) {
		return nil
	}
	rule := "must be an aggregate type topic " + e.Topic + " carries"
	if len(owned) > 0 {
		rule += " (" + strings.Join(owned, ", ") + ")"
	}
	rule += ": an aggregate type belongs to one topic (infra/topology.yaml, aggregate_types)"
	return []*event.FieldError{{Field: "aggregateType", Rule: rule}}
}

// accept checks each event's topic, writes the rest to the outbox in one
// statement and runs the fast path, all before deadline. It returns the
// results and the HTTP status, or an error answer. No Firestore call is
// awaited here: the registry is cached (and falls back on the topology),
// and the ledger records the sends after the fact.
func (h *Handler) accept(ctx context.Context, deadline time.Time, mode string, events []*event.Event) ([]Result, int, *ErrorResponse) {
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	results := make([]Result, len(events))
	consumers := map[string]int{}
	var write []*event.Event
	var writeAt []int
	for i, e := range events {
		results[i] = Result{EventID: e.ID, Topic: e.Topic, AggregateID: e.AggregateID, Version: e.Version, TraceID: e.TraceID}
		n, ok := consumers[e.Topic]
		if !ok {
			cs, err := h.reg.ExpectedConsumers(ctx, e.Topic)
			if err != nil {
				h.log.ErrorContext(ctx, "publish: cannot read the topic registry; nothing written", append(logging.Event(e),
					slog.String("topic", e.Topic), slog.String("mode", mode), slog.Any("error", err))...)
				return nil, http.StatusServiceUnavailable, &ErrorResponse{Error: CodeUnavailable,
					Message: "the topic registry is unavailable; nothing was written, retry with the same eventId"}
			}
			n = len(cs)
			consumers[e.Topic] = n
		}
		if n == 0 {
			results[i].Status = StatusSkipped
			results[i].Reason = "topic " + e.Topic + " has no enabled consumer in the topic registry; nothing was recorded or published"
			continue
		}
		write = append(write, e)
		writeAt = append(writeAt, i)
	}
	if len(write) == 0 {
		h.logSkipped(ctx, mode, events, results)
		return results, http.StatusOK, nil
	}

	var (
		enq   []outbox.Enqueued
		claim *relay.Claim
		err   error
	)
	fe, claiming := h.fast.(Enqueuer)
	switch b, tx := h.db.(migrate.Beginner); {
	case claiming:
		enq, claim, err = fe.EnqueueNow(ctx, write...)
	case tx:
		// In a transaction of its own, so a request is written whole or
		// not at all whatever another writer does at the same moment
		// (outbox.Enqueue).
		err = pgx.BeginFunc(ctx, b, func(tx pgx.Tx) error {
			enq, err = outbox.Enqueue(ctx, tx, write...)
			return err
		})
	default:
		enq, err = outbox.Enqueue(ctx, h.db, write...)
	}
	if err != nil {
		// Neither answer quotes the database's error: it would name the
		// stored row (its key), and nothing of another event is the
		// caller's business.
		var idc *outbox.IDConflictError
		if errors.As(err, &idc) {
			const rule = "must not be an eventId another event already has: a repeated eventId must repeat the same event (topic, aggregate, version, event type and payload)"
			resp := &ErrorResponse{Error: CodeEventIDConflict,
				Message: "eventId: another event already has this id; nothing was written (a retry must repeat the same event; a new event needs a new id)"}
			for i, e := range events {
				if slices.Contains(idc.IDs, e.ID) {
					p := FieldProblem{EventID: e.ID, Field: "eventId", Rule: rule}
					if len(events) > 1 {
						p.Index = &i
					}
					resp.Fields = append(resp.Fields, p)
				}
			}
			return nil, http.StatusConflict, resp
		}
		if errors.Is(err, outbox.ErrVersionConflict) {
			resp := &ErrorResponse{Error: CodeVersionConflict,
				Message: "version: the aggregate already has another event with this version; nothing was written"}
			if len(events) == 1 {
				resp.Fields = []FieldProblem{{EventID: events[0].ID, Field: "version", Rule: "must not be a version the aggregate already has under another eventId"}}
			}
			return nil, http.StatusConflict, resp
		}
		h.log.ErrorContext(ctx, "publish: outbox write failed", slog.String("mode", mode),
			slog.Int("events", len(write)), slog.String("first_event_id", write[0].ID), slog.Any("error", err))
		// The statement may have committed before the error reached us (a
		// connection lost, the budget ending): say so, and that a retry is
		// safe.
		msg := "the outbox is unavailable; retry with the same eventId (a repeat is recognized, so nothing is written twice)"
		if ctx.Err() != nil {
			msg = "the outbox did not answer within the request's budget; the event may have been written: retry with the same eventId (a repeat is recognized)"
		}
		return nil, http.StatusServiceUnavailable, &ErrorResponse{Error: CodeUnavailable, Message: msg}
	}
	h.logSkipped(ctx, mode, events, results)
	var now []string
	for k, q := range enq {
		i := writeAt[k]
		results[i].Status = string(q.State)
		results[i].Duplicate = q.Duplicate
		results[i].LastError = q.LastError
		results[i].DeliverAt = q.DeliverAt
		if q.Duplicate {
			// A repeat answers what was recorded the first time (its
			// trace id in particular, which may have been generated then).
			results[i].Topic, results[i].AggregateID, results[i].Version, results[i].TraceID = q.Topic, q.Aggregate.ID, q.Version, q.TraceID
		}
		if q.State == outbox.StatePending && !q.DeliverAt.After(time.Now()) {
			now = append(now, q.ID) // a scheduled one waits for the relay
		}
	}
	if h.fast != nil && len(now) > 0 {
		h.fastPath(ctx, mode, now, claim, results)
	}
	if h.log.Enabled(ctx, slog.LevelInfo) { // the fields are built only for a line that is written
		for k, e := range write {
			r := &results[writeAt[k]]
			h.log.InfoContext(ctx, "publish: event accepted", append(logging.Event(e), slog.String("topic", e.Topic),
				slog.String("status", r.Status), slog.Bool("duplicate", r.Duplicate), slog.String("mode", mode))...)
		}
	}
	return results, http.StatusAccepted, nil
}

// logSkipped logs each SKIPPED event at ERROR: an event nobody consumes is
// a configuration problem an operator must see, though the caller is not
// failed for it.
func (h *Handler) logSkipped(ctx context.Context, mode string, events []*event.Event, results []Result) {
	for i, e := range events {
		if results[i].Status == StatusSkipped {
			h.log.ErrorContext(ctx, "publish: no enabled consumer for the topic; event SKIPPED, nothing written",
				append(logging.Event(e), slog.String("topic", e.Topic), slog.String("mode", mode))...)
		}
	}
}

// fastPath publishes the pending rows at once, within what is left of the
// request's budget, and updates their results. A failure is only logged:
// the rows are committed and the relay publishes them.
func (h *Handler) fastPath(ctx context.Context, mode string, ids []string, claim *relay.Claim, results []Result) {
	// The rows are committed: finish (or give up) by the deadline even if
	// the caller hangs up, so no lease is left waiting for its expiry.
	deadline, _ := ctx.Deadline()
	ctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer cancel()
	var (
		states map[string]outbox.State
		err    error
	)
	if fe, ok := h.fast.(Enqueuer); ok && claim != nil {
		states, err = fe.PublishClaimed(ctx, claim)
	} else {
		states, err = h.fast.PublishNow(ctx, ids...)
	}
	if err != nil {
		h.log.WarnContext(ctx, "publish: fast path failed; the events stay pending for the relay",
			slog.String("mode", mode), slog.Int("events", len(ids)), slog.String("first_event_id", ids[0]), slog.Any("error", err))
	}
	for i := range results {
		if st, ok := states[results[i].EventID]; ok && results[i].Status == StatusPending {
			results[i].Status = string(st)
		}
	}
}

// limiterRate is the configured rate, for messages.
func (h *Handler) limiterRate() float64 {
	if h.limiter == nil {
		return 0
	}
	return h.limiter.Rate()
}

// clientAddr names a caller without a verified identity by its
// connection's address (not X-Forwarded-For, which the caller writes):
// behind a proxy, its callers share one bucket.
func clientAddr(r *http.Request) string {
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return host
	}
	return r.RemoteAddr
}

// requestID is the request's id as a proxy or Google's front end named it:
// X-Request-Id, else the trace of X-Cloud-Trace-Context (Cloud Run sets it
// on every request), at most 128 characters; "" when there is none.
func requestID(hdr http.Header) string {
	id := strings.TrimSpace(hdr.Get("X-Request-Id"))
	if id == "" {
		id, _, _ = strings.Cut(hdr.Get("X-Cloud-Trace-Context"), "/")
		id = strings.TrimSpace(id)
	}
	if len(id) > 128 {
		return ""
	}
	for _, c := range id {
		if c < 0x21 || c > 0x7e {
			return ""
		}
	}
	return id
}

// fail writes an error answer and logs it.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, mode string, status int, resp ErrorResponse) {
	level := slog.LevelWarn
	if status >= 500 {
		level = slog.LevelError
	}
	h.log.Log(r.Context(), level, "publish: request refused; nothing written", slog.Int("status", status),
		slog.String("error", resp.Error), slog.String("reason", resp.Message), slog.String("mode", mode),
		slog.String("content_type", r.Header.Get("Content-Type")))
	writeJSON(w, status, resp)
}

// problemsMessage joins the problems as "field: rule; ...", prefixing each
// with events[i]. in a batch.
func problemsMessage(ps []FieldProblem, batch bool) string {
	var sb strings.Builder
	for i, p := range ps {
		if i > 0 {
			sb.WriteString("; ")
		}
		if batch && p.Index != nil {
			sb.WriteString("events[" + strconv.Itoa(*p.Index) + "].")
		}
		sb.WriteString(p.Field)
		sb.WriteString(": ")
		sb.WriteString(p.Rule)
	}
	return sb.String()
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"error":"internal","message":"cannot encode the answer"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
