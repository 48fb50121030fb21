// Package dlqreplay is the operators' HTTP API (JSON) and, under /console/,
// their web console (event-ledger-design.md's "man"), one handler:
//
//	GET    /whoami                     the caller, and whether they may write
//	GET    /overview                   ?window=: events by status, dead letters per topic and consumer,
//	                                   outbox backlog, the lag of each hop over the last hour
//	GET    /events                     ?status=&topic=&eventType=&service=&traceId=&aggregateId=&from=&to=&pageSize=&pageToken=
//	GET    /events/{id}                the event (a JSON payload as JSON), every attempt by consumer, its
//	                                   outbox state, parent, children, dead letters and whether a re-push is allowed
//	POST   /events/{id}:repush         {"consumer", "dryRun"}: re-enqueue through the outbox (seed §5.2 rules)
//	GET    /traces/{eventId}           the event's trace as a tree
//	POST   /deadletters:archive        a DLQ delivery (push or Eventarc, from <topic>.dlq-monitor) is archived
//	GET    /deadletters                ?topic=&consumer=&reason=&eventId=&since=&until=&pageSize=&pageToken=&deleted=
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
//	GET    /audit                      ?action=&topic=&consumer=&limit=: who changed what, newest first
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
// constants). Writes (replay, bulk replay, delete, re-push, seek, snapshot,
// registry changes; dry runs are reads) need a caller DLQREPLAY_WRITERS
// lists (empty or *: everyone authenticated) and are refused with 403 in
// DLQREPLAY_READ_ONLY mode; POST /deadletters:archive needs a caller
// DLQREPLAY_ARCHIVERS lists (the DLQ monitors' push identity), and under
// DLQREPLAY_AUTH=token is authenticated by the push subscription's OIDC
// token instead of the static token, which push cannot send. Every write
// is logged with the caller's identity and appended to the ledger's audit
// log. Non-GET requests from another origin in a browser are refused
// (net/http.CrossOriginProtection). The handler works under
// http.StripPrefix.
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

	"github.com/relaybus/relaybus/shared/ledger/consumers"
	ledgerquery "github.com/relaybus/relaybus/shared/ledger/query"

	"github.com/jackc/pgx/v5/pgconn"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/relaybus/relaybus/shared/archive"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/ledger"
	"github.com/relaybus/relaybus/shared/ledger/audit"
	"github.com/relaybus/relaybus/shared/logging"
	"github.com/relaybus/relaybus/shared/postgres"
	"github.com/relaybus/relaybus/shared/topology"
)

// Defaults of Options.
const (
	// DefaultMaxRepushes refuses a re-push once an event was re-pushed this often.
	DefaultMaxRepushes = 3
	// DefaultSentTimeout is how long a SENT event must wait before it may be re-pushed.
	DefaultSentTimeout = 10 * time.Minute
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
	// Auth is AuthCloudRun, AuthIAM (the default), AuthToken (Token
	// required) or AuthNone; Audience, when set, is checked against the ID
	// token's aud.
	Auth, Audience, Token string
	// Writers may take write actions (empty or "*": every authenticated
	// caller); ReadOnly refuses every write action. Archivers may POST
	// dead letters to /deadletters:archive (empty: every authenticated
	// caller).
	Writers   []string
	ReadOnly  bool
	Archivers []string
	// Seeker, when set, serves seek, snapshots, pause and resume (its
	// subscription admin client).
	Seeker *Seeker
	// TimeSeeker, when set and Seeker is not, serves seek to a time on
	// another transport (NATS JetStream: natsjs.Client.SeekTime); seek to
	// a snapshot and snapshots stay Pub/Sub's (501).
	TimeSeeker TimeSeeker
	// PushTargets are the push consumers' endpoints and OIDC identities by
	// logical subscription (DLQREPLAY_PUSH_TARGETS): what resume restores.
	PushTargets map[string]PushTarget
	// PullConsumers are the logical subscriptions deployed in pull mode
	// (DLQREPLAY_PULL_CONSUMERS; Terraform's pull_mode): declared push, but
	// pulled by a worker, so they have no push endpoint to pause.
	PullConsumers []string
	// Pauser pauses and resumes consumers (pause, resume, rebuild); nil
	// with a Seeker means a PushPauser over the Seeker's client and
	// PushTargets.
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
	writers   principals
	archivers principals
	csrf      *http.CrossOriginProtection
	cache     overviewCache
}

// New returns the API's handler.
func New(o Options) (http.Handler, error) {
	if o.Archive == nil || o.Ledger == nil || o.DB == nil || o.Publisher == nil {
		return nil, errors.New("dlqreplay: Archive, Ledger, DB and Publisher are required")
	}
	switch o.Auth {
	case AuthNone, AuthCloudRun:
	case AuthToken:
		if o.Token == "" {
			return nil, errors.New("dlqreplay: DLQREPLAY_AUTH=token needs DLQREPLAY_TOKEN (a Secret Manager secret)")
		}
		if len(o.Archivers) == 0 {
			return nil, errors.New("dlqreplay: DLQREPLAY_AUTH=token needs DLQREPLAY_ARCHIVERS (the DLQ monitors' push service account): POST /deadletters:archive is authenticated by the push subscription's OIDC token, since push cannot send X-Relaybus-Token")
		}
	case AuthIAM, "":
		o.Auth = AuthIAM
	default:
		return nil, fmt.Errorf("dlqreplay: DLQREPLAY_AUTH=%q: want cloudrun, iam, token or none", o.Auth)
	}
	a := &api{o: o, csrf: http.NewCrossOriginProtection(),
		events: ledgerquery.New(o.Ledger.Client()), consumers: consumers.New(o.Ledger.Client(), consumers.Options{Audit: o.Ledger.Audit()})}
	var err error
	if a.writers, err = parsePrincipals("DLQREPLAY_WRITERS", o.Writers); err != nil {
		return nil, fmt.Errorf("dlqreplay: %w", err)
	}
	if a.archivers, err = parsePrincipals("DLQREPLAY_ARCHIVERS", o.Archivers); err != nil {
		return nil, fmt.Errorf("dlqreplay: %w", err)
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
	if a.o.Subscriptions == nil && a.o.Topology != nil {
		a.o.Subscriptions, _ = topology.NewSubscriptionMap(a.o.Topology, nil)
	}
	if a.o.Pauser == nil && a.o.Seeker != nil {
		a.o.Pauser = &PushPauser{Admin: a.o.Seeker.Admin, Project: a.o.Seeker.Project, Subscriptions: a.o.Subscriptions, Targets: a.o.PushTargets}
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
	who Principal
	id  string
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
		a.unauthenticated(w, err)
		return
	}
	req := &request{Request: r, who: who, id: rid}
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
	write   bool
	h       func(a *api, r *request, args []string) (any, error)
}

// pushedRoute is the route Pub/Sub push calls (the DLQ monitors), with the
// push subscription's OIDC token (pushIdentity under AuthToken).
const pushedRoute = "deadletters:archive"

func (rt *route) serve(a *api, r *request, args []string) (any, error) {
	if rt.write {
		if err := a.canWrite(r.who); err != nil {
			return nil, err
		}
	}
	return rt.h(a, r, args)
}

// routes lists the API. Write routes whose dry run is a read check the
// writer themselves (write false, a.canWrite when not a dry run).
var routes = []*route{
	{"GET", "whoami", false, (*api).whoami},
	{"GET", "overview", false, (*api).overview},
	{"GET", "events", false, (*api).listEvents},
	{"GET", "events/{}", false, (*api).getEvent},
	{"POST", "events/{}:repush", false, (*api).repush},
	{"GET", "traces/{}", false, (*api).trace},
	{"POST", pushedRoute, false, (*api).archive},
	{"POST", "deadletters:replay", false, (*api).replayBatch},
	{"GET", "deadletters", false, (*api).listLetters},
	{"GET", "deadletters/{}", false, (*api).getLetter},
	{"POST", "deadletters/{}:replay", false, (*api).replay},
	{"DELETE", "deadletters/{}", true, (*api).deleteLetter},
	{"GET", "consumers", false, (*api).listConsumers},
	{"POST", "consumers", true, (*api).addConsumer},
	{"PATCH", "consumers/{}/{}", true, (*api).changeConsumer},
	{"POST", "consumers/{}/{}:enable", true, (*api).enableConsumer},
	{"POST", "consumers/{}/{}:disable", true, (*api).disableConsumer},
	{"POST", "consumers/{}/{}:pause", true, (*api).pauseConsumer},
	{"POST", "consumers/{}/{}:resume", true, (*api).resumeConsumer},
	{"POST", "consumers/{}/{}:rebuild", false, (*api).rebuild},
	{"GET", "consumers/{}/{}/delivery", false, (*api).consumerDelivery},
	{"GET", "consumers/{}/{}/gaps", false, (*api).listGaps},
	{"POST", "consumers/{}/{}/gaps:skip", true, (*api).skipGap},
	{"GET", "audit", false, (*api).audit},
	{"POST", "subscriptions/{}:seek", true, (*api).seek},
	{"POST", "snapshots", true, (*api).createSnapshot},
	{"GET", "snapshots", false, (*api).listSnapshots},
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

// whoami tells the console who is calling and what they may do.
func (a *api) whoami(r *request, _ []string) (any, error) {
	if err := newQuery(r.Request).err(); err != nil {
		return nil, err
	}
	werr := a.canWrite(r.who)
	out := map[string]any{"caller": r.who.Name, "auth": r.who.Method, "canWrite": werr == nil, "readOnly": a.o.ReadOnly,
		"writers": a.writers.describe()}
	if a.o.TraceProject != "" {
		out["traceProject"] = a.o.TraceProject
	}
	if werr != nil {
		out["why"] = werr.(*apiError).Msg
	}
	return out, nil
}

// record logs a write action with the caller and appends it to the audit
// log; a failed audit write is logged, the action stands.
func (a *api) record(r *request, e audit.Entry, msg string, attrs ...any) {
	e.By = r.who.Name
	a.o.Logger.InfoContext(r.Context(), msg, append(attrs, "caller", r.who.Name, "auth", r.who.Method, "request_id", r.id)...)
	if _, err := a.o.Ledger.Audit().Append(context.WithoutCancel(r.Context()), e); err != nil {
		a.o.Logger.ErrorContext(r.Context(), "dlqreplay: audit entry not written", "action", e.Action, "caller", r.who.Name, "error", err.Error())
	}
}

func sortedStrings(s []string) []string {
	sort.Strings(s)
	return s
}
