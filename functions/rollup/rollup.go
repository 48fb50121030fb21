// Package rollup is the rollup function: it turns consumption attempts into
// each event's status in the Firestore ledger.
//
// consume publishes a notice to the rollup topic after it commits a batch
// of attempts: the attempts themselves (ledger.FoldMessage; notices of the
// former shape name only event ids, ledger.RollupMessage). Pub/Sub delivers
// it here by push or Eventarc. The function holds each event until every
// consumer its topic expects has reported, at most Deps.Window, and folds
// the due events' outcomes into their documents in batches
// (ledger.Store.Fold: each event's document in one read, one write with
// every consumer's outcome and the derived status, with preconditions; no
// transactions), never sooner than Deps.WriteGap after the event's last
// write. Answers:
//
//   - 200: rolled up (the JSON body says each event's status and whether it
//     changed); or, for a notice without attempts, an event is not in the
//     ledger yet after looking for it Deps.NotFoundWait: acknowledged with
//     "pending", since its attempts are documents the reconciler reads once
//     the send is recorded; or the notice was malformed and can never
//     succeed: acknowledged with an ERROR log line, never 400, which push
//     would redeliver forever.
//   - 500: Firestore failed, or a notice carries attempts of an event that
//     is not in the ledger yet and cannot create its document (no topic,
//     or a topic whose ledger level is off: "pending"): Pub/Sub redelivers
//     it (the notice is the attempts' only way into the ledger; the rollup
//     subscription has no dead-letter topic). A notice whose event's send
//     is not recorded yet otherwise creates the event's document
//     (ledger.Store.Fold): it never waits for the send, which the relay
//     records in the background and, after a burst, late.
//
// POST <root>/reconcile runs the reconciler (ledger.Store.Reconcile) for
// Cloud Scheduler: every event whose status is not settled and is due for
// a look gets its status derived again, so a lost notice never leaves a
// status behind. POST <root>/expire runs the expiry sweep
// (ledger.Store.ExpireDue): events nobody reports on become EXPIRED after
// their expireAt. Both are bounded (Deps.SweepBudget) and answer a JSON
// report.
//
// The function registers itself as the HTTP function "rollup"
// (functions.HTTP) and builds itself once per instance with Build from the
// environment (Config); the local stack and the tests call Build with
// their own Config. New builds the handler over a given Ledger (tests of
// its coalescing); it works under http.StripPrefix.
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

	"github.com/relaybus/relaybus/internal/privacy/topologyrules"

	"github.com/relaybus/relaybus/internal/ledger/model"

	"github.com/GoogleCloudPlatform/functions-framework-go/functions"

	"github.com/relaybus/relaybus/internal/delivery"
	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/internal/instance/fsopen"
	"github.com/relaybus/relaybus/internal/ledger"
	"github.com/relaybus/relaybus/internal/logging"
	"github.com/relaybus/relaybus/internal/telemetry"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/topology"
)

// Config is the rollup function's configuration.
type Config struct {
	// Env is what every function reads (GOOGLE_CLOUD_PROJECT, LOG_LEVEL,
	// RELAYBUS_TOPOLOGY, SHUTDOWN_TIMEOUT).
	instance.Env
	// Ledger is the Firestore ledger (FIRESTORE_DATABASE, LEDGER_RETENTION,
	// LEDGER_RECONCILE_AFTER).
	Ledger instance.Ledger
	// Mode is how notices arrive (ROLLUP_MODE): push (Pub/Sub push or
	// Eventarc, the default) or pull (the function pulls the rollup's
	// durable consumer on the broker PubSub names, which must be NATS:
	// feed.go). Terraform's nats transport sets pull.
	Mode string `env:"ROLLUP_MODE, default=push"`
	// PubSub is the broker pull mode pulls (TRANSPORT=nats, NATS_URL,
	// NATS_CREDS); push mode reads none of it.
	PubSub instance.PubSub
	// Window is the longest an event is held to gather its consumers'
	// notices into one rollup (ROLLUP_WINDOW, default 5s); it is rolled up
	// as soon as every expected consumer has reported.
	Window time.Duration `env:"ROLLUP_WINDOW, default=5s"`
	// WriteGap is the least time between two writes of one event's
	// document (ROLLUP_WRITE_GAP, default 1s): Firestore sustains about one
	// write per second per document.
	WriteGap time.Duration `env:"ROLLUP_WRITE_GAP, default=1s"`
}

// Ledger is what the function needs of the ledger (*ledger.Store).
type Ledger interface {
	RecordSent(ctx context.Context, sends []model.Sent) error
	Fold(ctx context.Context, notices []model.Notice, gap time.Duration) ([]ledger.RollupResult, error)
	Expected(ctx context.Context, topic string) ([]string, error)
	ExpireDue(ctx context.Context, limit int) (ledger.ExpireReport, error)
	Reconcile(ctx context.Context, limit int) (ledger.ReconcileReport, error)
}

// Deps are the function's dependencies.
type Deps struct {
	// Ledger is required.
	Ledger Ledger
	// Logger defaults to logging.Discard.
	Logger *slog.Logger
	// SweepBudget bounds one /expire or /reconcile call (default 45 s,
	// inside Cloud Scheduler's attempt deadline); a sweep stops between
	// batches.
	SweepBudget time.Duration
	// Window is the longest an event a notice names is held before its
	// rollup, gathering the notices of its other consumers (DefaultWindow).
	// An event is rolled up as soon as the notices carry an attempt of
	// every consumer its topic expects (Ledger.Expected), but not before
	// WriteGap after its first notice (its write would wait for the gap
	// after the send anyway), so in the happy path its document is written
	// once with all their outcomes, however far apart they report within
	// the window; only a consumer slower than the window costs a write of
	// its own. A notice without attempts (the
	// former shape) holds its event 250 ms at most.
	Window time.Duration
	// NotFoundWait is how long an event that is not in the ledger yet is
	// looked for again, 250 ms later, then twice as long each time, before
	// the notice is answered as pending (default 10 s). It applies to
	// notices that cannot create the event's document: without attempts
	// (the former shape; acknowledged then), or without a topic or of a
	// topic whose level is off (redelivered then). A notice that carries
	// its attempts creates the document of an event whose send is not
	// recorded yet (ledger.Store.Fold) and never waits for it.
	NotFoundWait time.Duration
	// WriteGap is the least time between two writes of one event's
	// document: a rollup due sooner after the event's last write (its
	// send, normally) waits for it (DefaultWriteGap; Firestore sustains about
	// one write per second per document,
	// https://firebase.google.com/docs/firestore/best-practices). Negative
	// waits for nothing.
	WriteGap time.Duration
}

// maxNoticeBody bounds a notice request: a push of the largest message a
// notice may be (a sends notice's 8 MiB, or 500 failed attempts with their
// error messages, about 2 MiB), base64 in its JSON wrapper; anything
// larger is malformed.
const maxNoticeBody = 12 << 20

// Defaults of Deps, and of ROLLUP_WINDOW and ROLLUP_WRITE_GAP (Config's
// tags; internal/instance's TestEachDefaultIsWrittenOnce ties the two).
const (
	DefaultWindow   = 5 * time.Second
	DefaultWriteGap = time.Second
)

// Handler is the rollup function's HTTP handler.
type Handler struct {
	Deps
	rollups *coalescer
	closer  func(ctx context.Context) error
	// stopFeed stops the NATS feed (nil on Pub/Sub): first at Close.
	stopFeed func(ctx context.Context) error
}

// New returns the rollup handler.
func New(_ context.Context, d Deps) (*Handler, error) {
	if d.Ledger == nil {
		return nil, errors.New("rollup: no ledger")
	}
	if d.Logger == nil {
		d.Logger = logging.Discard()
	}
	if d.SweepBudget <= 0 {
		d.SweepBudget = 45 * time.Second
	}
	if d.Window <= 0 {
		d.Window = DefaultWindow
	}
	if d.NotFoundWait <= 0 {
		d.NotFoundWait = 10 * time.Second
	}
	switch {
	case d.WriteGap == 0:
		d.WriteGap = DefaultWriteGap
	case d.WriteGap < 0:
		d.WriteGap = 0
	}
	h := &Handler{Deps: d}
	fold := func(ctx context.Context, ns []model.Notice) ([]ledger.RollupResult, error) {
		ctx, span := telemetry.Start(ctx, "rollup fold", telemetry.KindInternal, "", telemetry.KeyBatchCount.Int(len(ns)))
		res, err := d.Ledger.Fold(ctx, ns, d.WriteGap)
		span.End(err)
		recordSettled(ctx, res)
		return res, err
	}
	h.rollups = newCoalescer(fold, d.Window, notFoundPause, d.NotFoundWait, 8)
	h.rollups.expected, h.rollups.minHold = d.Ledger.Expected, d.WriteGap
	return h, nil
}

// recordSettled records the hop "consumer commit → final status"
// (relaybus.hop.duration, commit_to_status) of each event a fold just
// gave a settled status: from the newest consumer commit it was derived
// from to now, just after the write.
func recordSettled(ctx context.Context, results []ledger.RollupResult) {
	now := time.Now()
	for _, r := range results {
		if r.Err == nil && r.Changed && r.Status.Settled() && !r.LastCommit.IsZero() {
			telemetry.RecordHop(ctx, telemetry.HopCommitToStatus, r.Event.Topic, "", now.Sub(r.LastCommit))
		}
	}
}

// Close waits for the rollups under way, within ctx.
func (h *Handler) Close(ctx context.Context) error {
	var err error
	if h.stopFeed != nil {
		err = h.stopFeed(ctx)
	}
	err = errors.Join(err, h.rollups.close(ctx))
	if h.closer != nil {
		err = errors.Join(err, h.closer(ctx))
	}
	return err
}

// ServeHTTP serves POST /expire and /reconcile (the Scheduler's jobs) and
// the rollup notices pushed to any other path.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeJSON(w, http.StatusMethodNotAllowed, noticeAnswer{Error: "rollup accepts POST only"})
		return
	}
	switch strings.TrimSuffix(r.URL.Path, "/") {
	case "/expire":
		h.expire(w, r)
	case "/reconcile":
		h.reconcile(w, r)
	default:
		h.notice(w, r)
	}
}

// EventAnswer is one event's rollup in an answer.
type EventAnswer struct {
	EventID  string       `json:"eventId"`
	Status   model.Status `json:"status,omitempty"`
	Previous model.Status `json:"previous,omitempty"`
	Changed  bool         `json:"changed"`
	// Pending: the event is not in the ledger yet; the reconciler rolls it
	// up once its send is recorded.
	Pending bool `json:"pending,omitempty"`
}

// noticeAnswer is the JSON body of a handled notice: the event's fields
// when the notice named one, and every event in Events.
type noticeAnswer struct {
	EventAnswer
	Events []EventAnswer `json:"events,omitempty"`
	Error  string        `json:"error,omitempty"`
}

// sends records a sends notice's sends (a consumer's kicks of its child
// events, whose identity may not write the ledger): 200 once recorded,
// 503 to have it redelivered, 400 for one that cannot be read.
func (h *Handler) sends(ctx context.Context, w http.ResponseWriter, m event.Message, attrs []any) {
	sends, err := model.ReadSends(m)
	if err != nil {
		h.malformed(ctx, w, "", err, attrs)
		return
	}
	if err := h.Ledger.RecordSent(ctx, sends); err != nil {
		h.Logger.ErrorContext(ctx, "rollup: recording sends failed; the notice will be redelivered", append(attrs, "sends", len(sends), "error", err.Error())...)
		writeJSON(w, http.StatusServiceUnavailable, noticeAnswer{Error: "recording the sends failed"})
		return
	}
	h.Logger.DebugContext(ctx, "rollup: sends recorded", append(attrs, "sends", len(sends))...)
	writeJSON(w, http.StatusOK, noticeAnswer{})
}

func (h *Handler) notice(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	d, err := delivery.Read(r, maxNoticeBody)
	if err != nil {
		h.malformed(ctx, w, "", err, nil)
		return
	}
	attrs := []any{"delivery_mode", d.Mode, "message_id", d.Message.ID, "subscription", d.Subscription}
	if model.IsSendsNotice(d.Message) {
		h.sends(ctx, w, d.Message, attrs)
		return
	}
	notices, err := model.ReadNotice(d.Message)
	if err != nil {
		h.malformed(ctx, w, "", err, attrs)
		return
	}
	ids := make([]string, len(notices))
	for i, n := range notices {
		if err := model.CheckEventID(n.EventID); err != nil {
			h.malformed(ctx, w, n.EventID, err, attrs)
			return
		}
		ids[i] = n.EventID
	}
	results, err := h.rollups.do(ctx, notices)
	if errors.Is(err, errBusy) {
		h.Logger.ErrorContext(ctx, "rollup: too many events waiting; this notice will be redelivered", attrs...)
		writeJSON(w, http.StatusServiceUnavailable, noticeAnswer{Error: "rollup is overloaded"})
		return
	}
	if err != nil {
		writeJSON(w, http.StatusServiceUnavailable, noticeAnswer{Error: "the request ended before its rollup"})
		return
	}
	var ans noticeAnswer
	failed := false
	for i, id := range ids {
		res := results[id]
		ea := EventAnswer{EventID: id, Status: res.Status, Previous: res.Previous, Changed: res.Changed}
		switch {
		case res.Err == nil:
			fields := append(logging.Event(res.Event.LogEvent()), attrs...)
			fields = append(fields, "status", res.Status, "previous_status", res.Previous,
				"expected", res.Expected, "reported", res.Reported, "succeeded", res.Succeeded)
			if res.Changed {
				h.Logger.InfoContext(ctx, "rollup: status changed", fields...)
			} else {
				h.Logger.DebugContext(ctx, "rollup: status unchanged", fields...)
			}
		case errors.Is(res.Err, model.ErrEventNotFound) && !notices[i].Legacy:
			// The notice carries the attempts: it is their only way into
			// the ledger, so it is kept (redelivered) until the send is.
			failed, ea.Pending = true, true
			h.Logger.WarnContext(ctx, "rollup: event not in the ledger yet; the notice will be redelivered",
				append(attrs, "event_id", id)...)
		case errors.Is(res.Err, model.ErrEventNotFound):
			ea.Pending = true
			h.Logger.InfoContext(ctx, "rollup: event not in the ledger yet; the reconciler rolls it up once its send is recorded",
				append(attrs, "event_id", id)...)
		default:
			failed = true
			h.Logger.ErrorContext(ctx, "rollup failed; the notice will be redelivered", append(attrs, "event_id", id, "error", res.Err.Error())...)
		}
		ans.Events = append(ans.Events, ea)
	}
	if len(ids) == 1 {
		ans.EventAnswer = ans.Events[0]
	}
	if failed {
		ans.Error = "rollup failed"
		writeJSON(w, http.StatusInternalServerError, ans)
		return
	}
	writeJSON(w, http.StatusOK, ans)
}

// notFoundPause is how long the rollup waits before looking again for
// events that were not in the ledger yet.
const notFoundPause = 250 * time.Millisecond

// malformed acknowledges a notice that can never succeed.
func (h *Handler) malformed(ctx context.Context, w http.ResponseWriter, id string, err error, attrs []any) {
	fields := append(attrs, "error", err.Error())
	if id != "" {
		fields = append(fields, "event_id", id)
	}
	h.Logger.ErrorContext(ctx, "rollup: malformed notice acknowledged and dropped", fields...)
	writeJSON(w, http.StatusOK, noticeAnswer{EventAnswer: EventAnswer{EventID: id}, Error: "malformed notice: " + err.Error()})
}

// expireAnswer is the JSON body of /expire.
type expireAnswer struct {
	Due     int    `json:"due"`
	Expired int    `json:"expired"`
	More    bool   `json:"more"`
	Error   string `json:"error,omitempty"`
}

// sweepLimit reads a sweep's ?limit (0: the ledger's default) or answers 400.
func sweepLimit(w http.ResponseWriter, r *http.Request) (int, bool) {
	v := r.URL.Query().Get("limit")
	if v == "" {
		return 0, true
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 10000 {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "limit: an integer from 1 to 10000"})
		return 0, false
	}
	return n, true
}

func (h *Handler) expire(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	limit, ok := sweepLimit(w, r)
	if !ok {
		return
	}
	deadline := time.Now().Add(h.SweepBudget)
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

// reconcileAnswer is the JSON body of /reconcile.
type reconcileAnswer struct {
	ledger.ReconcileReport
	Error string `json:"error,omitempty"`
}

func (h *Handler) reconcile(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	limit, ok := sweepLimit(w, r)
	if !ok {
		return
	}
	deadline := time.Now().Add(h.SweepBudget)
	var total reconcileAnswer
	for {
		rep, err := h.Ledger.Reconcile(ctx, limit)
		total.Due += rep.Due
		total.Changed += rep.Changed
		total.Settled += rep.Settled
		total.More = rep.More
		if err != nil {
			h.Logger.ErrorContext(ctx, "reconciler failed; its next run tries again", "error", err.Error(), "due", total.Due)
			total.Error = "reconciler failed"
			writeJSON(w, http.StatusInternalServerError, total)
			return
		}
		if !rep.More || time.Now().After(deadline) {
			break
		}
	}
	level := slog.LevelDebug
	if total.Changed > 0 {
		level = slog.LevelInfo // a status only the reconciler brought up to date
	}
	h.Logger.Log(ctx, level, "reconciler", "due", total.Due, "changed", total.Changed, "settled", total.Settled, "more", total.More)
	writeJSON(w, http.StatusOK, total)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func init() {
	functions.HTTP("rollup", instance.Lazy("rollup", instance.FromEnv(instance.Load[Config], Build)))
	// Built at start, not on the first request: on NATS no request
	// comes, the feed is the function's work.
	instance.Warm("rollup")
}

// Build is the rollup function's one constructor, in production (from
// the environment), in the local stack and in tests: the ledger, with the
// topology's ledger levels (which attempts it keeps as documents when it
// folds them in: consume writes none), and the handler over it. Close
// closes the ledger.
func Build(ctx context.Context, cfg Config) (*Handler, error) {
	log := cfg.Logger()
	top, err := topology.Load(cfg.Topology)
	if err != nil {
		return nil, err
	}
	flush, err := cfg.StartTelemetry(ctx, "rollup")
	if err != nil {
		return nil, err
	}
	store, err := fsopen.Ledger(ctx, cfg.Ledger, cfg.ProjectID, ledger.Options{Logger: log, Levels: model.LevelsOf(top), Privacy: topologyrules.Of(top)})
	if err != nil {
		_ = flush(ctx)
		return nil, err
	}
	h, err := New(ctx, Deps{Ledger: store, Logger: log, Window: cfg.Window, WriteGap: cfg.WriteGap})
	if err != nil {
		_ = store.Close()
		_ = flush(ctx)
		return nil, err
	}
	// The ledger closes first; then what telemetry buffered is flushed.
	h.closer = func(ctx context.Context) error { return errors.Join(store.Close(), flush(ctx)) }
	switch cfg.Mode {
	case ModePush, "":
	case ModePull:
		if cfg.PubSub.Transport != instance.TransportNATS {
			_ = h.Close(ctx)
			return nil, fmt.Errorf("config: ROLLUP_MODE=pull needs TRANSPORT=nats (got %q): on Pub/Sub the rollup subscription pushes", cfg.PubSub.Transport)
		}
		if h.stopFeed, err = feed(ctx, cfg.PubSub, cfg.ProjectID, top, h, log); err != nil {
			_ = h.Close(ctx)
			return nil, err
		}
	default:
		_ = h.Close(ctx)
		return nil, fmt.Errorf("config: ROLLUP_MODE=%q: want %s or %s", cfg.Mode, ModePush, ModePull)
	}
	return h, nil
}

// Rollup modes ROLLUP_MODE names.
const (
	ModePush = "push"
	ModePull = "pull"
)
