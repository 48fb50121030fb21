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
	"net/url"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/relaybus/relaybus/internal/ledger/audit"
	"github.com/relaybus/relaybus/internal/ratelimit"
	"github.com/relaybus/relaybus/shared/event"
)

// server is the API's front: every request passes it before a resource
// serves it. It names the caller (auth.go), limits their rate, refuses
// cross-origin writes from browsers, gives each request an id, finds the
// route, checks the role the route needs at least, and answers the
// resource's result or error. The resources never call it: they are given
// the guard (rights.go, auditlog.go) and their own stores.
type server struct {
	auth     *authenticator
	bindings []Binding
	groups   GroupChecker
	limiter  *ratelimit.Limiter
	csrf     *http.CrossOriginProtection
	guard    *guard
	logger   *slog.Logger
	// readOnly and traceProject are what whoami tells the console.
	readOnly     bool
	traceProject string
	routes       routeTable
	console      http.Handler
	// jobs serves the replay jobs (jobs.go).
	jobs *replayJobs
	// archiveFeed archives what the DLQ monitors' pull feeds it
	// (archivefeed.go).
	archiveFeed http.Handler
}

// consoleMount is the path segment the console is served under.
const consoleMount = "console"

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

func (e *apiError) Error() string { return e.Code + ": " + e.Msg }

func fail(status int, code, format string, a ...any) *apiError {
	return &apiError{status: status, Code: code, Msg: fmt.Sprintf(format, a...)}
}

// unauthenticated is the 401 answer.
func (s *server) unauthenticated(w http.ResponseWriter, err error) {
	e := fail(http.StatusUnauthorized, "unauthenticated", "%v", err)
	e.Auth = s.auth.mode
	writeJSON(w, http.StatusUnauthorized, e)
}

// consoleCaller lets a caller load the console when they are
// authenticated, and answers 401 otherwise (console.Options.Authenticate).
func (s *server) consoleCaller(w http.ResponseWriter, r *http.Request) bool {
	if _, err := s.auth.authenticate(r); err != nil {
		s.unauthenticated(w, err)
		return false
	}
	return true
}

// request is one call being served.
type request struct {
	*http.Request
	who    Principal
	rights rights
	id     string
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rid := requestID(r)
	w.Header().Set("X-Request-Id", rid)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	path := strings.Trim(r.URL.Path, "/")
	if path == consoleMount || strings.HasPrefix(path, consoleMount+"/") {
		s.console.ServeHTTP(w, underConsole(r))
		return
	}
	if err := s.csrf.Check(r); err != nil {
		writeJSON(w, http.StatusForbidden, fail(http.StatusForbidden, "cross_origin", "a browser request from another origin may not change anything here"))
		return
	}
	rt, args, known := s.routes.match(path, r.Method)
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
	if rt.pattern == pushedRoute && s.auth.mode == AuthToken {
		// The DLQ monitors push: they cannot send the static token.
		who, err = s.auth.pushIdentity(r)
	} else {
		who, err = s.auth.authenticate(r)
	}
	if err != nil {
		s.logger.WarnContext(r.Context(), "dlqreplay: caller not authenticated", "request_id", rid, "path", clip(r.URL.Path, 300), "reason", err.Error())
		s.unauthenticated(w, err)
		return
	}
	// The DLQ monitors' pushes are Pub/Sub's flow, not a caller's: not
	// limited here.
	if ok, wait := s.limiter.Allow(who.Name); rt.pattern != pushedRoute && !ok {
		ratelimit.RetryAfter(w.Header(), wait)
		s.logger.WarnContext(r.Context(), "dlqreplay: caller over the rate limit", "request_id", rid, "caller", who.Name)
		writeJSON(w, http.StatusTooManyRequests, fail(http.StatusTooManyRequests, "rate_limited", "%s sends more than %g requests per second (DLQREPLAY_RATE_LIMIT); retry after %ss", who.Name, s.limiter.Rate(), w.Header().Get("Retry-After")))
		return
	}
	req := &request{Request: r, who: who, id: rid}
	if rt.pattern != pushedRoute {
		req.rights = s.rightsOf(r.Context(), who)
	}
	v, err := s.serve(rt, req, args)
	if err != nil {
		s.writeError(w, req, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

// underConsole is r with its path relative to the console's mount: "" for
// the mount itself, "/" for its index, "/app.js" for a file (the path's
// leading slashes and the mount's name dropped, as http.StripPrefix does
// for a fixed prefix).
func underConsole(r *http.Request) *http.Request {
	r2 := new(http.Request)
	*r2 = *r
	r2.URL = new(url.URL)
	*r2.URL = *r.URL
	r2.URL.Path = strings.TrimPrefix(strings.TrimLeft(r.URL.Path, "/"), consoleMount)
	r2.URL.RawPath = ""
	return r2
}

// serve checks the role the route needs at least (refusals are recorded)
// and hands the request to its resource.
func (s *server) serve(rt *route, r *request, args []string) (any, error) {
	if rt.role != "" && !r.rights.holds(rt.role) {
		err := fail(http.StatusForbidden, "forbidden", "%s holds no role here (%s needs at least %s): grant one in infra/topology.yaml operators or DLQREPLAY_ROLES (docs/security.md)",
			r.who.Name, rt.method+" /"+rt.pattern, rt.role)
		err.Missing = &missingRight{Role: rt.role, Action: audit.Read}
		s.guard.refused(r, rt.method+" /"+rt.pattern, target{}, err.Msg)
		return nil, err
	}
	return rt.h(r, args)
}

// writeError answers err: an apiError as it is; anything else as 503 when
// a store is unreachable, else 500, without its text (logged instead).
func (s *server) writeError(w http.ResponseWriter, r *request, err error) {
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
	s.logger.ErrorContext(r.Context(), "dlqreplay: request failed", "request_id", r.id, "method", r.Method,
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
	// on what it acts on (guard.authorize).
	role string
	h    func(r *request, args []string) (any, error)
}

// routeTable is the API's routes (routesOf).
type routeTable []*route

// pushedRoute is the route Pub/Sub push calls (the DLQ monitors), with the
// push subscription's OIDC token (pushIdentity under AuthToken).
const pushedRoute = "deadletters:archive"

// actions are the words a path may end in after a colon.
var actions = map[string]bool{"repush": true, "replay": true, "archive": true, "seek": true, "enable": true, "disable": true, "skip": true, "pause": true, "resume": true, "rebuild": true, "cancel": true, "run": true}

// match finds the route of a path and method. It returns the path's
// arguments, or, when the path is known but not for this method, the
// methods it takes.
func (t routeTable) match(path, method string) (*route, []string, []string) {
	body, action := path, ""
	if i := strings.LastIndexByte(path, ':'); i >= 0 && actions[path[i+1:]] && !strings.Contains(path[i+1:], "/") {
		body, action = path[:i], path[i+1:]
	}
	segs := strings.Split(body, "/")
	var methods []string
	for _, rt := range t {
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
func (s *server) whoami(r *request, _ []string) (any, error) {
	if err := newQuery(r.Request).err(); err != nil {
		return nil, err
	}
	roles := []Binding{}
	for _, b := range r.rights {
		roles = append(roles, Binding{Role: b.Role, Topics: b.Topics, Consumers: b.Consumers, Member: b.Member})
	}
	canWrite := !s.readOnly && r.rights.holds(RoleOperator)
	out := map[string]any{"caller": r.who.Name, "auth": r.who.Method, "roles": roles, "canWrite": canWrite, "readOnly": s.readOnly}
	if s.traceProject != "" {
		out["traceProject"] = s.traceProject
	}
	switch {
	case s.readOnly:
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
