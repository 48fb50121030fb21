// Package dlqreplay is the operators' HTTP API (JSON) and, under /console/,
// their web console, one handler:
//
//	GET    /whoami                     the caller, and whether they may write
//	GET    /overview                   ?window=: events by status, dead letters per topic and consumer,
//	                                   outbox backlog, the lag of each hop over the last hour
//	GET    /events                     ?status=&topic=&eventType=&service=&traceId=&aggregateId=&from=&to=&pageSize=&pageToken=
//	GET    /events/{id}                the event (a JSON payload as JSON), every attempt by consumer, its
//	                                   outbox state, parent, children, dead letters and whether a re-push is allowed
//	POST   /events/{id}:repush         {"consumer", "dryRun"}: re-enqueue through the outbox (docs/operations.md's re-push rules)
//	GET    /traces/{eventId}           the event's trace as a tree
//	POST   /deadletters:archive        a DLQ delivery (push or Eventarc, from <topic>.dlq-monitor) is archived
//	GET    /deadletters                ?topic=&consumer=&reason=&eventId=&since=&until=&pageSize=&pageToken=&deleted=
//	                                   (without the messages' data: GET /deadletters/{id} has it)
//	GET    /deadletters/{id}           the letter, with its event's attempt history from the ledger
//	POST   /deadletters/{id}:replay    republish the original for the failed consumer only (attribute
//	                                   target_consumer); {"dryRun": true} says what would happen
//	POST   /deadletters:replay         {"topic", "consumer", "reason", "since", "until", "includeReplayed",
//	                                   "dryRun", "expect"}: every matching letter, each to its consumer;
//	                                   the dry run counts them, "expect" makes the replay refuse another count
//	DELETE /deadletters/{id}           keep it as a tombstone with who and when
//	GET    /consumers                  the topic_consumers registry, with each consumer's subscription
//	POST   /consumers                  {"topic", "consumerId", "enabled", "description", "sortOrder"}: add one
//	PATCH  /consumers/{topic}/{id}     {"enabled", "description", "sortOrder"}: change one
//	POST   /consumers/{topic}/{id}:enable, :disable
//	POST   /consumers/{topic}/{id}:pause, :resume  detach / restore a push consumer's push endpoint:
//	                                   messages wait in its subscription meanwhile (pause.go)
//	GET    /consumers/{topic}/{id}/delivery  whether it is paused
//	POST   /consumers/{topic}/{id}:rebuild {"time" | "snapshot", "aggregateType", "dryRun"}: pause, clear
//	                                   its projection (scope) and inbox in its database, seek, resume (rebuild.go)
//	GET    /consumers/{topic}/{id}/gaps ?aggregateType=&aggregateId=&limit=: a strict consumer's open
//	                                   version gaps, oldest first, read from its own database
//	POST   /consumers/{topic}/{id}/gaps:skip {"aggregateType", "aggregateId", "version", "through",
//	                                   "reason"}: release a gap by skipping missing versions (gaps.go)
//	GET    /audit                      ?action=&topic=&consumer=&outcome=&limit=: who did (or was refused, or
//	                                   read) what, newest first
//	POST   /subscriptions/{name}:seek  {"time": RFC 3339} or {"snapshot": name}: redeliver from there
//	POST   /snapshots                  {"name", "subscription"}; GET /snapshots lists them
//
// Subscriptions are named logically (<topic>.<service>-<role>); the
// SubscriptionMap (DLQREPLAY_SUBSCRIPTIONS) turns an Eventarc consumer's
// into the trigger's real subscription for seek and snapshots, and the
// real one Pub/Sub stamps on dead letters back into the consumer.
//
// Answers: errors are {"code", "message"} (400 answers add "fields", each
// with its rule); every parameter and body field is validated (length,
// charset, range) before anything else happens, unknown parameters and
// fields included; unknown routes answer a JSON 404, a known route with
// another method 405. An internal failure answers 500 (503 when a store is
// unreachable) with a request id and no internal detail: the detail is in
// the log under that id.
//
// Auth (DLQREPLAY_AUTH): cloudrun, iam, token or none (see the Auth*
// constants) names the caller; roles say what they may do (rights.go): a
// viewer reads, an operator replays, deletes, re-pushes, seeks, pauses and
// skips gaps, an admin also adds consumers, disables a topic's last one and
// rebuilds projections, each on everything or on some topics and
// consumers. The roles are granted in infra/topology.yaml (operators), in
// DLQREPLAY_ROLES, and DLQREPLAY_WRITERS makes its principals admins of
// everything; a caller with none is refused everything but GET /whoami,
// with 403 naming the right it lacks. DLQREPLAY_READ_ONLY refuses every
// action. POST /deadletters:archive needs a caller DLQREPLAY_ARCHIVERS
// lists (the DLQ monitors' push identity; empty: nobody), and under
// DLQREPLAY_AUTH=token is authenticated by the push subscription's OIDC
// token instead of a personal token, which push cannot send. Each caller
// has a rate limit (DLQREPLAY_RATE_LIMIT, 429 with Retry-After).
//
// The audit log (AuditLog) records every action before it is taken (an
// entry that cannot be written refuses the action) and its outcome after,
// every payload read (an event's, a dead letter's) before it is answered,
// and every refusal, each with the verified caller. Non-GET requests from
// another origin in a browser are refused (net/http.CrossOriginProtection).
// The handler works under http.StripPrefix.
package dlqreplay

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/relaybus/relaybus/internal/ledger/consumers"
	ledgerquery "github.com/relaybus/relaybus/internal/ledger/query"

	"github.com/jackc/pgx/v5/pgconn"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/relaybus/relaybus/internal/archive"
	"github.com/relaybus/relaybus/internal/ledger"
	"github.com/relaybus/relaybus/internal/ledger/audit"
	"github.com/relaybus/relaybus/internal/logging"
	"github.com/relaybus/relaybus/internal/postgres"
	"github.com/relaybus/relaybus/internal/ratelimit"
	"github.com/relaybus/relaybus/internal/topology"
	"github.com/relaybus/relaybus/shared/broker"
	"github.com/relaybus/relaybus/shared/event"
)

// Defaults of Options.
const (
	// DefaultMaxRepushes refuses a re-push once an event was re-pushed this often.
	DefaultMaxRepushes = 3
	// DefaultSentTimeout is how long a SENT event must wait before it may be re-pushed.
	DefaultSentTimeout = 10 * time.Minute
	// DefaultRateLimit is the requests per second one caller may make (per
	// instance), DefaultRateBurst how many at once: a console's page loads
	// a handful; a script that loops is slowed down.
	DefaultRateLimit = 10
	DefaultRateBurst = 40
)

// Options configure the API. Archive, Ledger, DB and Publisher are required.
type Options struct {
	Archive   *archive.Store
	Ledger    *ledger.Store
	DB        postgres.DBTX
	Publisher event.Publisher
	// Topology, when set, tells the consumers' delivery, handler and
	// database (dry runs, the registry view) and validates registry edits.
	Topology *topology.Topology
	// Subscriptions maps logical subscriptions to the real ones (nil: every
	// subscription is its logical name).
	Subscriptions *topology.SubscriptionMap
	// Databases holds the topology's databases by name (its inboxes,
	// projections and outboxes) for dry runs and outbox states. Nil means DB
	// holds all of them (one database, as the local stack runs).
	Databases map[string]postgres.DBTX
	// Auth is AuthCloudRun (OnCloudRun required), AuthIAM (the default),
	// AuthToken (Token required) or AuthNone. Audience is the audiences
	// (comma-separated) an ID token may have: required by every mode but
	// AuthNone.
	Auth, Audience string
	// Token is AuthToken's personal tokens: a JSON object from each
	// holder's name (their email) to their token, of at least 32
	// characters.
	Token string
	// OnCloudRun says the process runs on Cloud Run (K_SERVICE is set):
	// AuthCloudRun runs only there, and AuthToken's archive route takes a
	// token whose signature Cloud Run's IAM removed only there.
	OnCloudRun bool
	// KeysURL and KeysClient are where AuthIAM and AuthToken fetch the
	// keys that sign ID tokens (Google's, identity.GoogleKeysURL, when
	// empty); tests serve their own.
	KeysURL    string
	KeysClient *http.Client
	// Roles grant the roles (the topology's operators are added to them).
	// Writers are admins of everything (DLQREPLAY_WRITERS). Closed by
	// default: with neither, nobody may do anything. ReadOnly refuses
	// every action above a viewer's. Archivers may POST dead letters to
	// /deadletters:archive (empty: nobody).
	Roles     []Binding
	Writers   []string
	ReadOnly  bool
	Archivers []string
	// Groups checks the members of the groups roles are granted to
	// (CloudIdentityGroups); required when a binding names a group.
	Groups GroupChecker
	// Audit is the audit log (the ledger's, Ledger.Audit(), when nil).
	Audit AuditLog
	// RateLimit and RateBurst bound each caller's requests per second
	// (DefaultRateLimit and DefaultRateBurst when zero; off when
	// RateLimit is negative): past them, 429 with Retry-After.
	RateLimit float64
	RateBurst int
	// Broker, when set, serves seek, snapshots, pause, resume and rebuild
	// with the capabilities it has (shared/broker, asked with broker.As):
	// a TimeSeeker seeks to a time, a Snapshotter keeps snapshots and
	// seeks to them, a PushConfigurer pauses push consumers. What it
	// lacks answers 501 (NATS JetStream seeks to a time only).
	Broker broker.Broker
	// PushTargets are the push consumers' endpoints and OIDC identities by
	// logical subscription (DLQREPLAY_PUSH_TARGETS): what resume restores.
	PushTargets map[string]PushTarget
	// PullConsumers are the logical subscriptions deployed in pull mode
	// (DLQREPLAY_PULL_CONSUMERS; Terraform's pull_mode): declared push, but
	// pulled by a worker, so they have no push endpoint to pause.
	PullConsumers []string
	// Pauser pauses and resumes consumers (pause, resume, rebuild); nil
	// with a Broker that is a PushConfigurer means a PushPauser over it
	// and PushTargets.
	Pauser Pauser
	// MaxRepushes and SentTimeout are the re-push rules (defaults above).
	MaxRepushes int
	SentTimeout time.Duration
	Logger      *slog.Logger
	// TraceProject, when set, is the Google Cloud project whose Cloud Trace
	// holds relaybus's traces: the console links each event's trace id
	// there. Empty: no link.
	TraceProject string
}

type api struct {
	o Options
	// events and consumers read the ledger and edit its registry, on the
	// ledger's client.
	events    *ledgerquery.Reader
	consumers *consumers.Registry
	auth      *authenticator
	bindings  []Binding
	archivers principals
	auditLog  AuditLog
	limiter   *ratelimit.Limiter
	csrf      *http.CrossOriginProtection
	cache     overviewCache
}

// New returns the API's handler.
func New(o Options) (http.Handler, error) {
	if o.Archive == nil || o.Ledger == nil || o.DB == nil || o.Publisher == nil {
		return nil, errors.New("dlqreplay: Archive, Ledger, DB and Publisher are required")
	}
	if o.Auth == "" {
		o.Auth = AuthIAM
	}
	au, err := newAuthenticator(&o)
	if err != nil {
		return nil, err
	}
	a := &api{o: o, csrf: http.NewCrossOriginProtection(), auth: au, auditLog: o.Audit,
		events: ledgerquery.New(o.Ledger.Client()), consumers: consumers.New(o.Ledger.Client(), consumers.Options{Audit: o.Ledger.Audit()})}
	if a.auditLog == nil {
		a.auditLog = o.Ledger.Audit()
	}
	if a.archivers, err = parsePrincipals("DLQREPLAY_ARCHIVERS", o.Archivers); err != nil {
		return nil, fmt.Errorf("dlqreplay: %w", err)
	}
	writers, err := parsePrincipals("DLQREPLAY_WRITERS", o.Writers)
	if err != nil {
		return nil, fmt.Errorf("dlqreplay: %w", err)
	}
	for _, w := range writers.list() {
		a.bindings = append(a.bindings, Binding{Member: w, Role: RoleAdmin})
	}
	a.bindings = append(a.bindings, o.Roles...)
	if o.Topology != nil {
		a.bindings = append(a.bindings, o.Topology.Operators...)
	}
	for i, b := range o.Roles {
		if b.Member == Anonymous { // the local stack's one caller
			b.Member = "anonymous@localhost"
		}
		if errs := b.Validate(fmt.Sprintf("Roles[%d]", i)); len(errs) > 0 {
			return nil, fmt.Errorf("dlqreplay: %w", errs[0])
		}
	}
	for _, b := range a.bindings {
		if parseMember(b.Member).group && o.Groups == nil {
			return nil, fmt.Errorf("dlqreplay: the role of %s needs its members looked up: set Groups (DLQREPLAY_GROUPS=cloudidentity)", b.Member)
		}
	}
	switch {
	case o.RateLimit < 0:
	case o.RateLimit == 0:
		a.limiter = ratelimit.New(ratelimit.Options{Rate: DefaultRateLimit, Burst: DefaultRateBurst})
	default:
		a.limiter = ratelimit.New(ratelimit.Options{Rate: o.RateLimit, Burst: o.RateBurst})
	}
	if a.o.MaxRepushes <= 0 {
		a.o.MaxRepushes = DefaultMaxRepushes
	}
	if a.o.SentTimeout <= 0 {
		a.o.SentTimeout = DefaultSentTimeout
	}
	if a.o.Logger == nil {
		a.o.Logger = logging.Discard()
	}
	if len(a.bindings) == 0 {
		a.o.Logger.Warn("dlqreplay: no role is granted (infra/topology.yaml operators, DLQREPLAY_ROLES, DLQREPLAY_WRITERS): every request but GET /whoami is refused")
	}
	if a.o.Subscriptions == nil && a.o.Topology != nil {
		a.o.Subscriptions, _ = topology.NewSubscriptionMap(a.o.Topology, nil)
	}
	if pc, ok := broker.As[broker.PushConfigurer](a.o.Broker); ok && a.o.Pauser == nil {
		a.o.Pauser = &PushPauser{Push: pc, Subscriptions: a.o.Subscriptions, Targets: a.o.PushTargets}
	}
	return a, nil
}

// apiError is an answer other than 200.
type apiError struct {
	status int
	Code   string      `json:"code"`
	Msg    string      `json:"message"`
	Fields []fieldRule `json:"fields,omitempty"`
	// RequestID ties a 5xx answer to its log entry.
	RequestID string `json:"requestId,omitempty"`
	// Auth names the auth mode in a 401, so the console knows to ask for a
	// token.
	Auth string `json:"auth,omitempty"`
	// Missing names, in a 403, the right the caller lacks.
	Missing *missingRight `json:"missing,omitempty"`
}

// unauthenticated is the 401 answer.
func (a *api) unauthenticated(w http.ResponseWriter, err error) {
	e := fail(http.StatusUnauthorized, "unauthenticated", "%v", err)
	e.Auth = a.o.Auth
	writeJSON(w, http.StatusUnauthorized, e)
}

func (e *apiError) Error() string { return e.Code + ": " + e.Msg }

func fail(status int, code, format string, a ...any) *apiError {
	return &apiError{status: status, Code: code, Msg: fmt.Sprintf(format, a...)}
}

// request is one call being served.
type request struct {
	*http.Request
	who    Principal
	rights rights
	id     string
}

func (a *api) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rid := requestID(r)
	w.Header().Set("X-Request-Id", rid)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	path := strings.Trim(r.URL.Path, "/")
	if path == "console" || strings.HasPrefix(path, "console/") {
		a.serveConsole(w, r, rid)
		return
	}
	if err := a.csrf.Check(r); err != nil {
		writeJSON(w, http.StatusForbidden, fail(http.StatusForbidden, "cross_origin", "a browser request from another origin may not change anything here"))
		return
	}
	rt, args, known := match(path, r.Method)
	if rt == nil {
		if known != nil {
			w.Header().Set("Allow", strings.Join(known, ", "))
			writeJSON(w, http.StatusMethodNotAllowed, fail(http.StatusMethodNotAllowed, "method_not_allowed", "%s /%s: this route takes %s", r.Method, clip(path, 200), strings.Join(known, ", ")))
			return
		}
		writeJSON(w, http.StatusNotFound, fail(http.StatusNotFound, "not_found", "no route for %s /%s", r.Method, clip(path, 200)))
		return
	}
	var who Principal
	var err error
	if rt.pattern == pushedRoute && a.o.Auth == AuthToken {
		// The DLQ monitors push: they cannot send the static token.
		who, err = a.pushIdentity(r)
	} else {
		who, err = a.authenticate(r)
	}
	if err != nil {
		a.o.Logger.WarnContext(r.Context(), "dlqreplay: caller not authenticated", "request_id", rid, "path", clip(r.URL.Path, 300), "reason", err.Error())
		a.unauthenticated(w, err)
		return
	}
	// The DLQ monitors' pushes are Pub/Sub's flow, not a caller's: not
	// limited here.
	if ok, wait := a.limiter.Allow(who.Name); rt.pattern != pushedRoute && !ok {
		ratelimit.RetryAfter(w.Header(), wait)
		a.o.Logger.WarnContext(r.Context(), "dlqreplay: caller over the rate limit", "request_id", rid, "caller", who.Name)
		writeJSON(w, http.StatusTooManyRequests, fail(http.StatusTooManyRequests, "rate_limited", "%s sends more than %g requests per second (DLQREPLAY_RATE_LIMIT); retry after %ss", who.Name, a.limiter.Rate(), w.Header().Get("Retry-After")))
		return
	}
	req := &request{Request: r, who: who, id: rid}
	if rt.pattern != pushedRoute {
		req.rights = a.rightsOf(r.Context(), who)
	}
	v, err := rt.serve(a, req, args)
	if err != nil {
		a.writeError(w, req, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

// writeError answers err: an apiError as it is; anything else as 503 when
// a store is unreachable, else 500, without its text (logged instead).
func (a *api) writeError(w http.ResponseWriter, r *request, err error) {
	var ae *apiError
	if errors.As(err, &ae) {
		writeJSON(w, ae.status, ae)
		return
	}
	if fe := event.FieldErrors(err); len(fe) > 0 && errors.Is(err, event.ErrInvalid) {
		writeJSON(w, http.StatusBadRequest, badRequest(fe))
		return
	}
	code, msg := http.StatusInternalServerError, "internal error"
	if unavailable(err) {
		code, msg = http.StatusServiceUnavailable, "a store the API depends on is unavailable; retry later"
	}
	a.o.Logger.ErrorContext(r.Context(), "dlqreplay: request failed", "request_id", r.id, "method", r.Method,
		"path", clip(r.URL.Path, 300), "caller", r.who.Name, "error", err.Error())
	e := fail(code, map[int]string{500: "internal", 503: "unavailable"}[code], "%s (request %s; the detail is in the service's log)", msg, r.id)
	e.RequestID = r.id
	writeJSON(w, code, e)
}

// unavailable reports whether err means a store could not be reached.
func unavailable(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return true
	}
	switch status.Code(err) { // status.Code sees a wrapped status too
	case codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted:
		return true
	}
	var ce *pgconn.ConnectError
	return errors.As(err, &ce) || pgconn.Timeout(err)
}

func requestID(r *http.Request) string {
	if tc := r.Header.Get("X-Cloud-Trace-Context"); tc != "" {
		if t, _, _ := strings.Cut(tc, "/"); charset(t, 64, "") {
			return t
		}
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// route is one operation.
type route struct {
	method string
	// pattern is segments with {} for a path argument; a trailing :action
	// is part of the last segment.
	pattern string
	// role is what the caller must hold on something to be served at all
	// ("" for none); the handler then checks the role its action needs
	// on what it acts on (a.authorize).
	role string
	h    func(a *api, r *request, args []string) (any, error)
}

// pushedRoute is the route Pub/Sub push calls (the DLQ monitors), with the
// push subscription's OIDC token (pushIdentity under AuthToken).
const pushedRoute = "deadletters:archive"

func (rt *route) serve(a *api, r *request, args []string) (any, error) {
	if rt.role != "" && !r.rights.holds(rt.role) {
		err := fail(http.StatusForbidden, "forbidden", "%s holds no role here (%s needs at least %s): grant one in infra/topology.yaml operators or DLQREPLAY_ROLES (docs/security.md)",
			r.who.Name, rt.method+" /"+rt.pattern, rt.role)
		err.Missing = &missingRight{Role: rt.role, Action: audit.Read}
		a.refused(r, rt.method+" /"+rt.pattern, target{}, err.Msg)
		return nil, err
	}
	return rt.h(a, r, args)
}

// routes lists the API. Every route but whoami and the DLQ monitors'
// archive needs a role; actions check the one they need on their target
// (a dry run is a viewer's read).
var routes = []*route{
	{"GET", "whoami", "", (*api).whoami},
	{"GET", "overview", RoleViewer, (*api).overview},
	{"GET", "events", RoleViewer, (*api).listEvents},
	{"GET", "events/{}", RoleViewer, (*api).getEvent},
	{"POST", "events/{}:repush", RoleViewer, (*api).repush},
	{"GET", "traces/{}", RoleViewer, (*api).trace},
	{"POST", pushedRoute, "", (*api).archive},
	{"POST", "deadletters:replay", RoleViewer, (*api).replayBatch},
	{"GET", "deadletters", RoleViewer, (*api).listLetters},
	{"GET", "deadletters/{}", RoleViewer, (*api).getLetter},
	{"POST", "deadletters/{}:replay", RoleViewer, (*api).replay},
	{"DELETE", "deadletters/{}", RoleOperator, (*api).deleteLetter},
	{"GET", "consumers", RoleViewer, (*api).listConsumers},
	{"POST", "consumers", RoleAdmin, (*api).addConsumer},
	{"PATCH", "consumers/{}/{}", RoleOperator, (*api).changeConsumer},
	{"POST", "consumers/{}/{}:enable", RoleOperator, (*api).enableConsumer},
	{"POST", "consumers/{}/{}:disable", RoleOperator, (*api).disableConsumer},
	{"POST", "consumers/{}/{}:pause", RoleOperator, (*api).pauseConsumer},
	{"POST", "consumers/{}/{}:resume", RoleOperator, (*api).resumeConsumer},
	{"POST", "consumers/{}/{}:rebuild", RoleViewer, (*api).rebuild},
	{"GET", "consumers/{}/{}/delivery", RoleViewer, (*api).consumerDelivery},
	{"GET", "consumers/{}/{}/gaps", RoleViewer, (*api).listGaps},
	{"POST", "consumers/{}/{}/gaps:skip", RoleOperator, (*api).skipGap},
	{"GET", "audit", RoleViewer, (*api).audit},
	{"POST", "subscriptions/{}:seek", RoleOperator, (*api).seek},
	{"POST", "snapshots", RoleOperator, (*api).createSnapshot},
	{"GET", "snapshots", RoleViewer, (*api).listSnapshots},
}

// actions are the words a path may end in after a colon.
var actions = map[string]bool{"repush": true, "replay": true, "archive": true, "seek": true, "enable": true, "disable": true, "skip": true, "pause": true, "resume": true, "rebuild": true}

// match finds the route of a path and method. It returns the path's
// arguments, or, when the path is known but not for this method, the
// methods it takes.
func match(path, method string) (*route, []string, []string) {
	body, action := path, ""
	if i := strings.LastIndexByte(path, ':'); i >= 0 && actions[path[i+1:]] && !strings.Contains(path[i+1:], "/") {
		body, action = path[:i], path[i+1:]
	}
	segs := strings.Split(body, "/")
	var methods []string
	for _, rt := range routes {
		pbody, paction, _ := strings.Cut(rt.pattern, ":")
		psegs := strings.Split(pbody, "/")
		if paction != action || len(psegs) != len(segs) {
			continue
		}
		var args []string
		ok := true
		for i, p := range psegs {
			switch {
			case p == "{}" && segs[i] != "":
				args = append(args, segs[i])
			case p != segs[i]:
				ok = false
			}
		}
		if !ok {
			continue
		}
		if rt.method == method {
			return rt, args, nil
		}
		methods = append(methods, rt.method)
	}
	sort.Strings(methods)
	return nil, nil, methods
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// whoami tells the console who is calling and what they may do: the
// caller's own roles, never anyone else's.
func (a *api) whoami(r *request, _ []string) (any, error) {
	if err := newQuery(r.Request).err(); err != nil {
		return nil, err
	}
	roles := []Binding{}
	for _, b := range r.rights {
		roles = append(roles, Binding{Role: b.Role, Topics: b.Topics, Consumers: b.Consumers, Member: b.Member})
	}
	canWrite := !a.o.ReadOnly && r.rights.holds(RoleOperator)
	out := map[string]any{"caller": r.who.Name, "auth": r.who.Method, "roles": roles, "canWrite": canWrite, "readOnly": a.o.ReadOnly}
	if a.o.TraceProject != "" {
		out["traceProject"] = a.o.TraceProject
	}
	switch {
	case a.o.ReadOnly:
		out["why"] = "this operations API is read-only (DLQREPLAY_READ_ONLY)"
	case len(r.rights) == 0:
		out["why"] = r.who.Name + " holds no role: ask an admin to grant one (infra/topology.yaml operators or DLQREPLAY_ROLES)"
	case !canWrite:
		out["why"] = r.who.Name + " is a viewer: an operator or admin role is needed to act"
	}
	return out, nil
}

func sortedStrings(s []string) []string {
	sort.Strings(s)
	return s
}
