// Package dlqreplay is the operator's HTTP API (JSON):
//
//	POST   /deadletters:archive        a DLQ delivery (push or Eventarc, from <topic>.dlq-monitor) is archived
//	GET    /deadletters                ?topic=&consumer=&reason=&since=&until=&pageSize=&pageToken=&deleted=true
//	GET    /deadletters/{id}           the letter, with its event's attempt history from the ledger
//	POST   /deadletters/{id}:replay    republish the original to its topic for the failed consumer only
//	                                   (attribute target_consumer); {"dryRun": true} says what it would do
//	POST   /deadletters:replay         {"topic", "consumer", "reason", "dryRun"}: every matching letter;
//	                                   the dry run answers the count first
//	DELETE /deadletters/{id}           keep it as a tombstone with who and when
//	POST   /events/{id}:repush         {"consumer": "..."} re-enqueue through the outbox (seed §5.2 rules)
//	GET    /events                     ?status=&topic=&service=&traceId=&pageSize=&pageToken=
//	GET    /events/{id}                one event with every attempt grouped by consumer
//	GET    /traces/{eventId}           the event's trace as a tree
//	POST   /subscriptions/{name}:seek  {"time": RFC 3339} or {"snapshot": name}: redeliver from there
//	POST   /snapshots                  {"name", "subscription"}; GET /snapshots lists them
//
// Errors are {"code", "message"}: 404 for unknown ids, 409 with the rule for
// a refused re-push or replay, 400 for bad parameters, 401 without valid
// credentials. Every mutating call is logged with the caller's identity:
// the verified Google ID token's email (DLQREPLAY_AUTH=iam), "token"
// (DLQREPLAY_AUTH=token, a bearer DLQREPLAY_TOKEN) or "anonymous" (none,
// for local runs). The handler works under http.StripPrefix.
//
// Not built: a Scheduler-driven sync that pulls the DLQ monitor
// subscriptions (they push to /deadletters:archive instead).
package dlqreplay

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

	"google.golang.org/api/idtoken"

	"github.com/relaybus/relaybus/shared/archive"
	"github.com/relaybus/relaybus/shared/delivery"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/ledger"
	"github.com/relaybus/relaybus/shared/logging"
	"github.com/relaybus/relaybus/shared/names"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/topology"
)

// Publisher republishes replayed messages (a *transport.Client).
type Publisher interface {
	Publish(ctx context.Context, topic string, m event.Message) (string, error)
}

// Auth modes (DLQREPLAY_AUTH).
const (
	AuthIAM   = "iam"
	AuthToken = "token"
	AuthNone  = "none"
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
	DB        outbox.DBTX
	Publisher Publisher
	// Auth is AuthIAM (the default: verify the Google ID token, and its
	// audience when Audience is set), AuthToken (Token required) or AuthNone.
	Auth, Audience, Token string
	// Seeker, when set, serves seek and snapshots.
	Seeker *Seeker
	// MaxRepushes and SentTimeout are the re-push rules (defaults above).
	MaxRepushes int
	SentTimeout time.Duration
	Logger      *slog.Logger
}

type api struct {
	o Options
}

// New returns the API's handler.
func New(o Options) (http.Handler, error) {
	if o.Archive == nil || o.Ledger == nil || o.DB == nil || o.Publisher == nil {
		return nil, errors.New("dlqreplay: Archive, Ledger, DB and Publisher are required")
	}
	switch o.Auth {
	case AuthNone:
	case AuthToken:
		if o.Token == "" {
			return nil, errors.New("dlqreplay: DLQREPLAY_AUTH=token needs DLQREPLAY_TOKEN")
		}
	case AuthIAM, "":
		o.Auth = AuthIAM // Cloud Run's IAM already checked the audience; Audience adds our own check
	default:
		return nil, fmt.Errorf("dlqreplay: DLQREPLAY_AUTH=%q: want iam, token or none", o.Auth)
	}
	if o.MaxRepushes <= 0 {
		o.MaxRepushes = DefaultMaxRepushes
	}
	if o.SentTimeout <= 0 {
		o.SentTimeout = DefaultSentTimeout
	}
	if o.Logger == nil {
		o.Logger = logging.Discard()
	}
	return &api{o: o}, nil
}

type apiError struct {
	status int
	Code   string `json:"code"`
	Msg    string `json:"message"`
}

func (e *apiError) Error() string { return e.Code + ": " + e.Msg }

func fail(status int, code, format string, a ...any) *apiError {
	return &apiError{status: status, Code: code, Msg: fmt.Sprintf(format, a...)}
}

func (a *api) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	who, err := a.caller(r)
	if err != nil {
		writeJSON(w, http.StatusUnauthorized, fail(401, "unauthenticated", "%v", err))
		return
	}
	v, err := a.route(r, who)
	if err != nil {
		var ae *apiError
		if !errors.As(err, &ae) {
			ae = fail(http.StatusInternalServerError, "internal", "%v", err)
		}
		writeJSON(w, ae.status, ae)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

// caller authenticates the request and names the caller.
func (a *api) caller(r *http.Request) (string, error) {
	if a.o.Auth == AuthNone {
		return "anonymous", nil
	}
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || tok == "" {
		return "", errors.New("an Authorization: Bearer header is required")
	}
	if a.o.Auth == AuthToken {
		if tok != a.o.Token {
			return "", errors.New("the bearer token is not DLQREPLAY_TOKEN")
		}
		return "token", nil
	}
	p, err := idtoken.Validate(r.Context(), tok, a.o.Audience)
	if err != nil {
		return "", fmt.Errorf("the ID token does not verify: %w", err)
	}
	if email, _ := p.Claims["email"].(string); email != "" {
		return email, nil
	}
	return p.Subject, nil
}

func (a *api) route(r *http.Request, who string) (any, error) {
	path := strings.Trim(r.URL.Path, "/")
	head, rest, _ := strings.Cut(path, "/")
	id, action, _ := strings.Cut(rest, ":")
	if rest == "" {
		head, action, _ = strings.Cut(head, ":")
	}
	switch {
	case head == "deadletters" && rest == "" && action == "archive" && r.Method == http.MethodPost:
		return a.archive(r)
	case head == "deadletters" && rest == "" && action == "replay" && r.Method == http.MethodPost:
		return a.replayBatch(r, who)
	case head == "deadletters" && rest == "" && action == "" && r.Method == http.MethodGet:
		return a.listLetters(r)
	case head == "deadletters" && id != "" && action == "" && r.Method == http.MethodGet:
		return a.getLetter(r.Context(), id)
	case head == "deadletters" && id != "" && action == "replay" && r.Method == http.MethodPost:
		return a.replay(r, id, who)
	case head == "deadletters" && id != "" && action == "" && r.Method == http.MethodDelete:
		l, err := a.o.Archive.Delete(r.Context(), id, who)
		if err == nil {
			a.o.Logger.InfoContext(r.Context(), "dlqreplay: dead letter deleted", "dead_letter_id", id, "caller", who)
		}
		return l, mapErr(err)
	case head == "events" && id != "" && action == "repush" && r.Method == http.MethodPost:
		return a.repush(r, id, who)
	case head == "events" && rest == "" && r.Method == http.MethodGet:
		return a.listEvents(r)
	case head == "events" && id != "" && action == "" && r.Method == http.MethodGet:
		d, err := a.o.Ledger.Get(r.Context(), id)
		return d, mapErr(err)
	case head == "subscriptions" && id != "" && action == "seek" && r.Method == http.MethodPost:
		return a.seek(r, id, who)
	case head == "snapshots" && rest == "" && r.Method == http.MethodPost:
		return a.createSnapshot(r, who)
	case head == "snapshots" && rest == "" && r.Method == http.MethodGet:
		return a.listSnapshots(r.Context())
	case head == "traces" && id != "" && r.Method == http.MethodGet:
		t, err := a.o.Ledger.Trace(r.Context(), id)
		return t, mapErr(err)
	}
	return nil, fail(http.StatusNotFound, "not_found", "no route for %s /%s", r.Method, path)
}

func mapErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, archive.ErrNotFound), errors.Is(err, ledger.ErrEventNotFound):
		return fail(http.StatusNotFound, "not_found", "%v", err)
	case errors.Is(err, event.ErrInvalid):
		return fail(http.StatusBadRequest, "invalid_argument", "%v", err)
	}
	return err
}

func (a *api) archive(r *http.Request) (any, error) {
	d, err := delivery.Read(r, delivery.DefaultMaxBody)
	if err != nil {
		// Not a delivery: acknowledged (a 4xx would be redelivered forever).
		a.o.Logger.ErrorContext(r.Context(), "dlqreplay: archive request is not a Pub/Sub delivery", "error", err.Error())
		return map[string]string{"ignored": err.Error()}, nil
	}
	// A DLQ monitor subscription names its topic (<topic>.dlq-monitor);
	// otherwise the delivery may (Eventarc's source).
	topic := ""
	if sub := d.Subscription; sub != "" {
		if id := sub[strings.LastIndex(sub, "/")+1:]; strings.HasSuffix(id, names.DeadLetterSuffix+"-monitor") {
			topic = strings.TrimSuffix(id, "-monitor")
		}
	}
	if topic == "" {
		topic = d.Topic()
	}
	if !names.IsDeadLetter(topic) {
		return nil, fail(http.StatusBadRequest, "invalid_argument", "the delivery's topic %q is not a dead-letter topic", topic)
	}
	l, created, err := a.o.Archive.Archive(r.Context(), topic, d.Message)
	if err != nil {
		return nil, err
	}
	if created {
		a.o.Logger.WarnContext(r.Context(), "dlqreplay: dead letter archived", "dead_letter_id", l.ID, "topic", l.Topic,
			"consumer", l.Consumer, "reason", l.Reason, "event_id", l.EventID)
	}
	return map[string]any{"id": l.ID, "created": created}, nil
}

func (a *api) listLetters(r *http.Request) (any, error) {
	q := r.URL.Query()
	f := archive.Filter{Topic: q.Get("topic"), Consumer: q.Get("consumer"), Reason: q.Get("reason"), Deleted: q.Get("deleted") == "true"}
	var err error
	if f.Since, err = parseTime(q, "since"); err != nil {
		return nil, err
	}
	if f.Until, err = parseTime(q, "until"); err != nil {
		return nil, err
	}
	size, _ := strconv.Atoi(q.Get("pageSize"))
	letters, next, err := a.o.Archive.List(r.Context(), f, size, q.Get("pageToken"))
	if err != nil {
		return nil, mapErr(err)
	}
	if letters == nil {
		letters = []archive.Letter{}
	}
	return map[string]any{"deadLetters": letters, "nextPageToken": next}, nil
}

func parseTime(q map[string][]string, name string) (time.Time, error) {
	v := ""
	if vs := q[name]; len(vs) > 0 {
		v = vs[0]
	}
	if v == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return time.Time{}, fail(http.StatusBadRequest, "invalid_argument", "%s: an RFC 3339 time, got %q", name, v)
	}
	return t, nil
}

// letterDetail is a letter with its event's ledger history.
type letterDetail struct {
	archive.Letter
	Event *ledger.Detail `json:"ledger,omitempty"`
}

func (a *api) getLetter(ctx context.Context, id string) (any, error) {
	l, err := a.o.Archive.Get(ctx, id)
	if err != nil {
		return nil, mapErr(err)
	}
	out := letterDetail{Letter: l}
	if l.EventID != "" {
		if d, err := a.o.Ledger.Get(ctx, l.EventID); err == nil {
			out.Event = &d
		}
	}
	return out, nil
}

type replayRequest struct {
	DryRun bool `json:"dryRun"`
}

func (a *api) replay(r *http.Request, id, who string) (any, error) {
	var req replayRequest
	if r.ContentLength != 0 {
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			return nil, fail(http.StatusBadRequest, "invalid_argument", "body: %v", err)
		}
	}
	if r.URL.Query().Get("dryRun") == "true" {
		req.DryRun = true
	}
	l, err := a.o.Archive.Get(r.Context(), id)
	if err != nil {
		return nil, mapErr(err)
	}
	if l.Deleted {
		return nil, fail(http.StatusConflict, "deleted", "dead letter %s was deleted by %s", id, l.DeletedBy)
	}
	if l.Consumer == "" {
		return nil, fail(http.StatusConflict, "no_consumer", "dead letter %s does not say which consumer failed it", id)
	}
	m := l.Original()
	m.Attributes[topology.TargetConsumerAttr] = l.Consumer
	plan := map[string]any{"topic": l.Topic, "consumer": l.Consumer, "eventId": l.EventID, "dryRun": req.DryRun}
	if req.DryRun {
		return plan, nil
	}
	msgID, err := a.o.Publisher.Publish(r.Context(), l.Topic, m)
	if err != nil {
		return nil, err
	}
	if err := a.o.Archive.AddReplay(r.Context(), id, archive.Replay{By: who, At: time.Now().UTC(), MessageID: msgID, Consumer: l.Consumer}); err != nil {
		return nil, err
	}
	a.o.Logger.InfoContext(r.Context(), "dlqreplay: dead letter replayed", "dead_letter_id", id, "topic", l.Topic,
		"consumer", l.Consumer, "event_id", l.EventID, "caller", who, "message_id", msgID)
	plan["messageId"] = msgID
	return plan, nil
}

type batchRequest struct {
	Topic, Consumer, Reason string
	DryRun                  bool `json:"dryRun"`
}

// replayBatch replays every letter matching the filter (at most 500 per
// call; call again for more), each to the consumer that failed it.
func (a *api) replayBatch(r *http.Request, who string) (any, error) {
	var req batchRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		return nil, fail(http.StatusBadRequest, "invalid_argument", "body: %v", err)
	}
	if req.Topic == "" && req.Consumer == "" && req.Reason == "" {
		return nil, fail(http.StatusBadRequest, "invalid_argument", "give at least one of topic, consumer, reason")
	}
	letters, next, err := a.o.Archive.List(r.Context(), archive.Filter{Topic: req.Topic, Consumer: req.Consumer, Reason: req.Reason}, 500, "")
	if err != nil {
		return nil, err
	}
	out := map[string]any{"matched": len(letters), "more": next != "", "dryRun": req.DryRun}
	if req.DryRun {
		return out, nil
	}
	replayed := 0
	for _, l := range letters {
		if l.Consumer == "" {
			continue
		}
		m := l.Original()
		m.Attributes[topology.TargetConsumerAttr] = l.Consumer
		id, err := a.o.Publisher.Publish(r.Context(), l.Topic, m)
		if err != nil {
			out["replayed"], out["error"] = replayed, err.Error()
			return out, nil
		}
		if err := a.o.Archive.AddReplay(r.Context(), l.ID, archive.Replay{By: who, At: time.Now().UTC(), MessageID: id, Consumer: l.Consumer}); err != nil {
			return nil, err
		}
		replayed++
	}
	a.o.Logger.InfoContext(r.Context(), "dlqreplay: dead letters replayed", "topic", req.Topic, "consumer", req.Consumer,
		"reason", req.Reason, "replayed", replayed, "caller", who)
	out["replayed"] = replayed
	return out, nil
}

type repushRequest struct {
	Consumer string `json:"consumer"`
}

func (a *api) repush(r *http.Request, id, who string) (any, error) {
	var req repushRequest
	if r.ContentLength != 0 {
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			return nil, fail(http.StatusBadRequest, "invalid_argument", "body: %v", err)
		}
	}
	now := time.Now().UTC()
	check := func(d ledger.Event) error {
		switch {
		case !d.ExpireAt.IsZero() && now.After(d.ExpireAt):
			return fail(http.StatusConflict, "expired", "event %s expired at %s and is not re-pushed", id, d.ExpireAt.Format(time.RFC3339))
		case d.RetryCount >= a.o.MaxRepushes:
			return fail(http.StatusConflict, "max_repushes", "event %s was re-pushed %d times, the most allowed", id, d.RetryCount)
		case d.Status == ledger.StatusFailed || d.Status == ledger.StatusRetrying || d.Status == ledger.StatusPartial:
			return nil
		case d.Status == ledger.StatusSent && now.Sub(d.LastSentAt) >= a.o.SentTimeout:
			return nil
		case d.Status == ledger.StatusSent:
			return fail(http.StatusConflict, "too_recent", "event %s was sent %s ago; SENT events are re-pushed after %s", id, now.Sub(d.LastSentAt).Round(time.Second), a.o.SentTimeout)
		}
		return fail(http.StatusConflict, "status", "event %s is %s; only FAILED, RETRYING, PARTIAL or long-SENT events are re-pushed", id, d.Status)
	}
	d, err := a.o.Ledger.BeginRepush(r.Context(), id, req.Consumer, check, now)
	if err != nil {
		return nil, mapErr(err)
	}
	e, err := d.Envelope()
	if err != nil {
		return nil, fail(http.StatusConflict, "payload_omitted", "%v", err)
	}
	if _, err := outbox.Repush(r.Context(), a.o.DB, &e, req.Consumer); err != nil && !errors.Is(err, outbox.ErrPending) {
		return nil, err
	}
	a.o.Logger.InfoContext(r.Context(), "dlqreplay: event re-pushed", append(logging.Event(&e), "consumer", req.Consumer, "caller", who)...)
	return map[string]any{"eventId": id, "status": ledger.StatusRetrying, "retryCount": d.RetryCount, "consumer": req.Consumer}, nil
}

func (a *api) listEvents(r *http.Request) (any, error) {
	q := r.URL.Query()
	size, _ := strconv.Atoi(q.Get("pageSize"))
	lq := ledger.ListQuery{Topic: q.Get("topic"), InitiatorService: q.Get("service"), TraceID: q.Get("traceId"),
		PageSize: size, PageToken: q.Get("pageToken")}
	if s := q.Get("status"); s != "" {
		lq.Status = ledger.Status(s)
	}
	p, err := a.o.Ledger.List(r.Context(), lq)
	return p, mapErr(err)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
