package dlqreplay

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"cloud.google.com/go/firestore"
	"google.golang.org/api/iterator"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/relaybus/relaybus/internal/archive"
	"github.com/relaybus/relaybus/internal/ledger/audit"
	"github.com/relaybus/relaybus/internal/ledger/model"
	ledgerquery "github.com/relaybus/relaybus/internal/ledger/query"
	"github.com/relaybus/relaybus/internal/names"
	"github.com/relaybus/relaybus/internal/telemetry"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/topology"
)

// Replay jobs: every event of a topic that one consumer failed (or
// dead-lettered) in a time window, optionally of one error class or code,
// counted first (a dry run), then sent to that consumer alone at a bounded
// rate, as a job with progress that can be cancelled and that survives the
// instance running it.
//
// Where a job lives: a document of JobCollection in the ledger's Firestore
// database, the store this API already keeps its operators' state in (the
// dead-letter archive, the consumer registry, the audit log): the job
// reads its events from that database, and a Firestore transaction is all
// a lease needs. Its sends are a subcollection (JobSendsCollection), one
// document per event, created before the event is sent: that create is
// the job's cursor, so an event is sent at most once within the job
// whatever instance crashes when.
//
// Who runs it: its callers, inside their requests. dlqreplay does its
// work inside requests (on Cloud Run it runs with request-based billing,
// so an instance has CPU only while it serves one), so a job advances
// while someone drives it: POST /jobs/{id}:run works on it for a slice
// (DefaultJobSlice, at most MaxJobSlice) and answers its progress.
// `relaybus replay` and `relaybus jobs run` call it until the job ends,
// the console's jobs view while it is open. A slice holds a lease on the
// job's document (JobLease, renewed at every progress write, about once a
// second), so two callers never drive one job at once; a slice that ends
// releases it, and one whose instance vanished lets it lapse, after which
// the next :run, on any instance, resumes the job from its cursor.

// Defaults and bounds of replay jobs.
const (
	// DefaultJobRate is a job's send rate (events per second) when the
	// request names none; MaxJobRate is the highest it takes.
	DefaultJobRate = 10
	MaxJobRate     = 100
	// MaxJobScan is how many ledger events of the topic a dry run or a job
	// reads in its window at most: a window holding more is refused (narrow it).
	MaxJobScan = 20000
	// MaxJobWindow is the longest since-until window.
	MaxJobWindow = 31 * 24 * time.Hour
	// JobLease is how long a worker's lease on a job lasts without being
	// renewed; a job whose lease lapsed is picked up again.
	JobLease = 30 * time.Second
	// DefaultJobSlice is how long one POST /jobs/{id}:run works on the
	// job, unless it asks for another slice (1 to MaxJobSlice seconds,
	// under dlqreplay's request timeout).
	DefaultJobSlice = 25 * time.Second
	MaxJobSlice     = 240 * time.Second
	// JobCollection holds the jobs, JobSendsCollection (a subcollection of
	// each job) their sends.
	JobCollection      = "replay_jobs"
	JobSendsCollection = "sends"
)

// Job states.
const (
	JobRunning   = "running"
	JobDone      = "done"
	JobCancelled = "cancelled"
)

// Outcomes a replay filter selects (the consumer's latest attempt).
const (
	// FilterFailed: the consumer's latest attempt failed (a permanent
	// business error, or a transient one Pub/Sub still retries) and the
	// event was not dead-lettered: it is re-pushed through the outbox to
	// that consumer alone.
	FilterFailed = "failed"
	// FilterDeadLettered: the event was dead-lettered for the consumer
	// (Pub/Sub gave up, or consume found it poison): its archived dead
	// letter is replayed to that consumer alone.
	FilterDeadLettered = "dead_lettered"
)

// Error classes (shared/consumer.Classify), as the ledger records them in
// an attempt's outcome.
var classOutcomes = map[string][]model.Outcome{
	"transient": {model.OutcomeRetry, model.OutcomeDeadLettered},
	"permanent": {model.OutcomeFailed},
	"poison":    {model.OutcomePoison},
}

var filterOutcomes = map[string][]model.Outcome{
	FilterFailed:       {model.OutcomeFailed, model.OutcomeRetry},
	FilterDeadLettered: {model.OutcomeDeadLettered, model.OutcomePoison},
}

const (
	ruleOutcome    = "failed or dead_lettered"
	ruleErrorClass = "transient, permanent or poison"
	ruleErrorCode  = "1 to 64 characters of [A-Za-z0-9._:-]"
)

// replayFilter selects the events a job sends.
type replayFilter struct {
	Topic      string    `firestore:"topic" json:"topic"`
	Consumer   string    `firestore:"consumer" json:"consumer"`
	Since      time.Time `firestore:"since" json:"since"`
	Until      time.Time `firestore:"until" json:"until"`
	Outcome    string    `firestore:"outcome" json:"outcome"`
	ErrorClass string    `firestore:"errorClass,omitempty" json:"errorClass,omitempty"`
	ErrorCode  string    `firestore:"errorCode,omitempty" json:"errorCode,omitempty"`
}

// String says the filter in one line (audit entries, logs).
func (f replayFilter) String() string {
	s := fmt.Sprintf("topic=%s consumer=%s outcome=%s since=%s until=%s", f.Topic, f.Consumer, f.Outcome,
		f.Since.Format(time.RFC3339), f.Until.Format(time.RFC3339))
	if f.ErrorClass != "" {
		s += " errorClass=" + f.ErrorClass
	}
	if f.ErrorCode != "" {
		s += " errorCode=" + f.ErrorCode
	}
	return s
}

// match reports whether the event's document matches, with the consumer's
// latest attempt. The window bounds when the event occurred (published):
// since inclusive, until exclusive.
func (f replayFilter) match(d *model.Event) (model.AttemptMark, bool) {
	m, ok := d.Latest[f.Consumer]
	if !ok || d.Topic != f.Topic || d.OccurredAt.Before(f.Since) || !d.OccurredAt.Before(f.Until) {
		return m, false
	}
	in := func(os []model.Outcome) bool {
		for _, o := range os {
			if m.Outcome == o {
				return true
			}
		}
		return false
	}
	if !in(filterOutcomes[f.Outcome]) || (f.ErrorClass != "" && !in(classOutcomes[f.ErrorClass])) {
		return m, false
	}
	return m, f.ErrorCode == "" || m.ErrorCode == f.ErrorCode
}

// replayJobRequest is POST /replays's body.
type replayJobRequest struct {
	Topic      string   `json:"topic"`
	Consumer   string   `json:"consumer"`
	Since      string   `json:"since"`
	Until      string   `json:"until"`
	Outcome    string   `json:"outcome"`
	ErrorClass string   `json:"errorClass"`
	ErrorCode  string   `json:"errorCode"`
	Rate       *float64 `json:"rate"`
	DryRun     bool     `json:"dryRun"`
	// Expect, when set, is the count the operator confirmed: the job is
	// refused when the filter now matches another number.
	Expect *int `json:"expect"`
}

// filter validates the request into a filter and a rate, naming each
// broken field with its rule.
func (req replayJobRequest) filter(top *topology.Topology) (replayFilter, float64, error) {
	var bad invalid
	f := replayFilter{Topic: req.Topic, Consumer: req.Consumer, Outcome: req.Outcome, ErrorClass: req.ErrorClass, ErrorCode: req.ErrorCode}
	bad.topicConsumer(top, req.Topic, req.Consumer)
	tm := func(name, s string) time.Time {
		if s == "" {
			bad.add(name, "required: %s", ruleTime)
			return time.Time{}
		}
		t, err := time.Parse(time.RFC3339, s)
		if err != nil || t.Before(minTime) || !t.Before(maxTime) || len(s) > 40 {
			bad.add(name, "%s", ruleTime)
			return time.Time{}
		}
		return t.UTC()
	}
	f.Since, f.Until = tm("since", req.Since), tm("until", req.Until)
	if !f.Since.IsZero() && !f.Until.IsZero() {
		if !f.Since.Before(f.Until) {
			bad.add("until", "later than since")
		} else if f.Until.Sub(f.Since) > MaxJobWindow {
			bad.add("until", "at most %s after since", MaxJobWindow)
		}
	}
	if _, ok := filterOutcomes[req.Outcome]; !ok {
		bad.add("outcome", "required: %s", ruleOutcome)
	}
	if req.ErrorClass != "" {
		os, ok := classOutcomes[req.ErrorClass]
		switch {
		case !ok:
			bad.add("errorClass", "%s", ruleErrorClass)
		case filterOutcomes[req.Outcome] != nil && !overlaps(os, filterOutcomes[req.Outcome]):
			bad.add("errorClass", "%s events are never %s: with outcome %s, give %s", req.ErrorClass, req.Outcome, req.Outcome,
				map[string]string{FilterFailed: "transient or permanent", FilterDeadLettered: "transient or poison"}[req.Outcome])
		}
	}
	if req.ErrorCode != "" && !charset(req.ErrorCode, 64, "._:-") {
		bad.add("errorCode", "%s", ruleErrorCode)
	}
	rate := float64(DefaultJobRate)
	if req.Rate != nil {
		rate = *req.Rate
		if rate < 0.1 || rate > MaxJobRate {
			bad.add("rate", "events per second, from 0.1 to %d (default %d)", MaxJobRate, DefaultJobRate)
		}
	}
	if req.Expect != nil && (*req.Expect < 0 || *req.Expect > MaxJobScan) {
		bad.add("expect", "an integer from 0 to %d", MaxJobScan)
	}
	return f, rate, bad.err()
}

// topicConsumer checks a request's topic and consumer: both required,
// named by the rules, the consumer one the topology declares on the topic
// (top nil: any).
func (bad *invalid) topicConsumer(top *topology.Topology, topic, consumer string) {
	switch {
	case topic == "":
		bad.add("topic", "required: %s", names.TopicRule)
	case names.ValidateTopic(topic) != nil || names.IsDeadLetter(topic):
		bad.add("topic", "%s", names.TopicRule)
	}
	switch {
	case consumer == "":
		bad.add("consumer", "required: %s", names.ConsumerRule)
	case names.ValidateConsumer(consumer) != nil:
		bad.add("consumer", "%s", names.ConsumerRule)
	case top != nil && len(bad.fields) == 0 && !declares(top, topic, consumer):
		bad.add("consumer", "a consumer of %s the topology declares", topic)
	}
}

func declares(top *topology.Topology, topic, consumer string) bool {
	for _, c := range top.Consumers() {
		if c.Topic == topic && c.Service == consumer {
			return true
		}
	}
	return false
}

func overlaps(a, b []model.Outcome) bool {
	for _, x := range a {
		for _, y := range b {
			if x == y {
				return true
			}
		}
	}
	return false
}

// replayJob is a job's document.
type replayJob struct {
	ID     string       `firestore:"-" json:"id"`
	Filter replayFilter `firestore:"filter" json:"filter"`
	// Rate is the most events per second the job sends.
	Rate  float64 `firestore:"rate" json:"rate"`
	State string  `firestore:"state" json:"state"`
	// CreatedBy started the job; AuditRef is its audit entry (started).
	CreatedBy string    `firestore:"createdBy" json:"createdBy"`
	CreatedAt time.Time `firestore:"createdAt" json:"createdAt"`
	AuditRef  string    `firestore:"auditRef" json:"auditRef"`
	// Matched is how many events matched when the job was created.
	Matched int `firestore:"matched" json:"matched"`
	// Sent, Failed and Skipped count the events handled so far (Skipped:
	// still pending in the outbox, so already on their way).
	Sent    int `firestore:"sent" json:"sent"`
	Failed  int `firestore:"failed" json:"failed"`
	Skipped int `firestore:"skipped" json:"skipped"`
	// LastError is the latest send's failure.
	LastError string `firestore:"lastError,omitempty" json:"lastError,omitempty"`
	// PageToken is the ledger listing's page the worker is on ("" for the
	// first); the sends subcollection says which of its events were sent.
	PageToken string `firestore:"pageToken" json:"-"`
	// Owner is the worker holding the lease until LeaseUntil.
	Owner      string    `firestore:"owner" json:"-"`
	LeaseUntil time.Time `firestore:"leaseUntil" json:"-"`
	// Released says the last worker ended its slice and released the
	// lease (its progress is written); Resumed counts the workers that
	// took the job over from one that vanished.
	Released bool `firestore:"released" json:"-"`
	Resumed  int  `firestore:"resumed" json:"resumed"`
	// StartedAt is the first send's time (the rate and ETA are measured
	// from it), UpdatedAt the latest progress write.
	StartedAt  time.Time `firestore:"startedAt,omitempty" json:"startedAt,omitzero"`
	UpdatedAt  time.Time `firestore:"updatedAt" json:"updatedAt"`
	FinishedAt time.Time `firestore:"finishedAt,omitempty" json:"finishedAt,omitzero"`
	// CancelledBy asked to cancel it.
	CancelledBy string `firestore:"cancelledBy,omitempty" json:"cancelledBy,omitempty"`
}

// jobView is a job as the API answers it: the document and its progress.
type jobView struct {
	replayJob
	Remaining int `json:"remaining"`
	// Rate is the measured send rate (events/s) since the first send;
	// ETASeconds the time the remaining events take at it.
	MeasuredRate float64 `json:"measuredRate"`
	ETASeconds   float64 `json:"etaSeconds"`
}

func (j replayJob) view(now time.Time) jobView {
	v := jobView{replayJob: j}
	handled := j.Sent + j.Failed + j.Skipped
	if j.State == JobRunning {
		v.Remaining = max(j.Matched-handled, 0)
	}
	end := j.UpdatedAt
	if j.State == JobRunning {
		end = now
	}
	if el := end.Sub(j.StartedAt).Seconds(); !j.StartedAt.IsZero() && el > 0 && handled > 0 {
		v.MeasuredRate = float64(handled) / el
		v.ETASeconds = float64(v.Remaining) / min(v.MeasuredRate, j.Rate)
	}
	return v
}

// jobSend is one event a job sent (a document of JobSendsCollection, its
// id the event's document id), created before the send.
type jobSend struct {
	EventID string    `firestore:"eventId" json:"eventId"`
	At      time.Time `firestore:"at" json:"at"`
	// State is sending (created, the send under way or cut short by a
	// crash), sent, skipped or failed.
	State  string `firestore:"state" json:"state"`
	Via    string `firestore:"via" json:"via"`
	Detail string `firestore:"detail,omitempty" json:"detail,omitempty"`
}

// replayJobs serves the replay jobs and runs their workers.
type replayJobs struct {
	client   *firestore.Client
	reader   *ledgerquery.Reader
	letters  *letters
	events   *events
	topology *topology.Topology
	audit    AuditLog
	g        *guard
	logger   *slog.Logger

	// now is the clock of leases and progress; stopAfter, when set, makes
	// a worker stop dead (no progress written, lease kept) after that many
	// sends: how the tests stand for an instance that vanished.
	now       func() time.Time
	stopAfter int
}

func (jb *replayJobs) col() *firestore.CollectionRef { return jb.client.Collection(JobCollection) }

// scan reads the ledger's events of the filter's topic and window and
// returns those that match (up to sample of them) and how many, and how
// many it read. It refuses a window holding more than MaxJobScan events.
func (jb *replayJobs) scan(ctx context.Context, f replayFilter, sample int) (int, int, []map[string]any, error) {
	matched, scanned, token := 0, 0, ""
	out := []map[string]any{}
	for {
		page, err := jb.reader.List(ctx, ledgerquery.ListQuery{Topic: f.Topic, From: f.Since, To: f.Until, PageSize: ledgerquery.MaxPageSize, PageToken: token})
		if err != nil {
			return 0, 0, nil, err
		}
		for i := range page.Events {
			scanned++
			if m, ok := f.match(&page.Events[i]); ok {
				matched++
				if len(out) < sample {
					out = append(out, map[string]any{"eventId": page.Events[i].EventID, "occurredAt": page.Events[i].OccurredAt,
						"outcome": m.Outcome, "errorCode": m.ErrorCode, "attemptNo": m.AttemptNo})
				}
			}
		}
		if scanned > MaxJobScan {
			return 0, scanned, nil, badRequest([]*event.FieldError{{Field: "until",
				Rule: fmt.Sprintf("a window holding at most %d events of %s: it holds more, narrow since and until", MaxJobScan, f.Topic)}})
		}
		if page.NextPageToken == "" {
			return matched, scanned, out, nil
		}
		token = page.NextPageToken
	}
}

// create is POST /replays: the dry run counts (a viewer's read), else the
// job is created, audited and started (an operator's action).
func (jb *replayJobs) create(r *request, _ []string) (any, error) {
	if err := newQuery(r.Request).err(); err != nil {
		return nil, err
	}
	var req replayJobRequest
	if err := decodeBody(r.Request, &req, false); err != nil {
		return nil, err
	}
	f, rate, err := req.filter(jb.topology)
	if err != nil {
		return nil, err
	}
	role := RoleOperator
	if req.DryRun {
		role = RoleViewer
	}
	if err := jb.g.authorize(r, audit.ReplayJob, role, target{Topic: f.Topic, Consumer: f.Consumer}); err != nil {
		return nil, err
	}
	matched, scanned, sample, err := jb.scan(r.Context(), f, 10)
	if err != nil {
		return nil, err
	}
	if req.DryRun {
		return map[string]any{"dryRun": true, "filter": f, "matched": matched, "scanned": scanned, "sample": sample, "rate": rate,
			"via": map[string]string{FilterFailed: "re-push through the outbox", FilterDeadLettered: "dead letter replay"}[f.Outcome]}, nil
	}
	if req.Expect != nil && *req.Expect != matched {
		return nil, fail(http.StatusConflict, "count_changed", "you confirmed %d events, the filter now matches %d: run the dry run again", *req.Expect, matched)
	}
	now := jb.now().UTC()
	j := replayJob{ID: newJobID(now), Filter: f, Rate: rate, State: JobRunning, CreatedBy: r.who.Name, CreatedAt: now, Matched: matched, UpdatedAt: now}
	st, err := jb.g.begin(r, audit.Entry{Action: audit.ReplayJob, Topic: f.Topic, ConsumerID: f.Consumer,
		Detail: fmt.Sprintf("job %s: send %d events matching %s at %g/s", j.ID, matched, f, rate)})
	if err != nil {
		return nil, err
	}
	j.AuditRef = st.entry.ID
	if _, err := jb.col().Doc(j.ID).Create(r.Context(), j); err != nil {
		st.end(err, "")
		return nil, err
	}
	jb.logger.InfoContext(r.Context(), "dlqreplay: replay job created", "job", j.ID, "caller", r.who.Name, "filter", f.String(), "matched", matched)
	return j.view(now), nil
}

func newJobID(now time.Time) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "job-" + now.Format("20060102-150405") + "-" + hex.EncodeToString(b[:])
}

func jobID(s string) (string, error) {
	if !charset(s, 64, "-") {
		return "", badRequest([]*event.FieldError{{Field: "id", Rule: "a job id: 1 to 64 characters of [A-Za-z0-9-]"}})
	}
	return s, nil
}

// list is GET /jobs: the newest jobs first (limit, 20 by default).
func (jb *replayJobs) list(r *request, _ []string) (any, error) {
	q := newQuery(r.Request, "limit", "state")
	limit := q.integer("limit", 1, 200)
	state := q.str("state", func(s string) bool {
		return s == JobRunning || s == JobDone || s == JobCancelled
	}, "running, done or cancelled")
	if err := q.err(); err != nil {
		return nil, err
	}
	if limit == 0 {
		limit = 20
	}
	it := jb.col().OrderBy("createdAt", firestore.Desc).Limit(200).Documents(r.Context())
	defer it.Stop()
	now := jb.now()
	out := []jobView{}
	for len(out) < limit {
		snap, err := it.Next()
		if errors.Is(err, iterator.Done) {
			break
		}
		if err != nil {
			return nil, err
		}
		var j replayJob
		if err := snap.DataTo(&j); err != nil {
			return nil, err
		}
		j.ID = snap.Ref.ID
		if state == "" || j.State == state {
			out = append(out, j.view(now))
		}
	}
	return map[string]any{"jobs": out}, nil
}

// get is GET /jobs/{id}: the job and its progress.
func (jb *replayJobs) get(r *request, args []string) (any, error) {
	id, err := jobID(args[0])
	if err != nil {
		return nil, err
	}
	if err := newQuery(r.Request).err(); err != nil {
		return nil, err
	}
	j, err := jb.load(r.Context(), id)
	if err != nil {
		return nil, err
	}
	return j.view(jb.now()), nil
}

func (jb *replayJobs) load(ctx context.Context, id string) (replayJob, error) {
	snap, err := jb.col().Doc(id).Get(ctx)
	if status.Code(err) == codes.NotFound {
		return replayJob{}, fail(http.StatusNotFound, "not_found", "no replay job has that id")
	}
	if err != nil {
		return replayJob{}, err
	}
	var j replayJob
	if err := snap.DataTo(&j); err != nil {
		return replayJob{}, err
	}
	j.ID = id
	return j, nil
}

// cancel is POST /jobs/{id}:cancel: the job stops before its next send
// (its worker reads the request at its next progress write, within about
// a second; a job with no live worker stops at once).
func (jb *replayJobs) cancel(r *request, args []string) (any, error) {
	id, err := jobID(args[0])
	if err != nil {
		return nil, err
	}
	if err := newQuery(r.Request).err(); err != nil {
		return nil, err
	}
	if err := decodeBody(r.Request, &struct{}{}, true); err != nil {
		return nil, err
	}
	j, err := jb.load(r.Context(), id)
	if err != nil {
		return nil, err
	}
	if err := jb.g.authorize(r, audit.ReplayJobCancel, RoleOperator, target{Topic: j.Filter.Topic, Consumer: j.Filter.Consumer}); err != nil {
		return nil, err
	}
	if j.State != JobRunning {
		return nil, fail(http.StatusConflict, "not_running", "job %s is %s: only a running job can be cancelled", id, j.State)
	}
	err = jb.g.run(r, audit.Entry{Action: audit.ReplayJobCancel, Topic: j.Filter.Topic, ConsumerID: j.Filter.Consumer,
		Detail: "cancel job " + id}, func(*step) (string, error) {
		return "job " + id + " cancelled", jb.client.RunTransaction(r.Context(), func(ctx context.Context, tx *firestore.Transaction) error {
			ref := jb.col().Doc(id)
			snap, err := tx.Get(ref)
			if err != nil {
				return err
			}
			var cur replayJob
			if err := snap.DataTo(&cur); err != nil {
				return err
			}
			if cur.State != JobRunning {
				return fail(http.StatusConflict, "not_running", "job %s is %s: only a running job can be cancelled", id, cur.State)
			}
			j = cur
			j.ID = id
			j.State, j.CancelledBy, j.FinishedAt, j.UpdatedAt = JobCancelled, r.who.Name, jb.now().UTC(), jb.now().UTC()
			return tx.Set(ref, j)
		})
	})
	if err != nil {
		return nil, err
	}
	jb.finished(j)
	return j.view(jb.now()), nil
}

// jobRunRequest is POST /jobs/{id}:run's optional body.
type jobRunRequest struct {
	// Seconds is how long to work on the job (DefaultJobSlice when 0).
	Seconds int `json:"seconds"`
}

// run is POST /jobs/{id}:run: work on the job for a slice, inside this
// request, and answer its progress. A job another caller drives now is
// answered as it is (busy: true); a job that ended, as it ended.
func (jb *replayJobs) run(r *request, args []string) (any, error) {
	id, err := jobID(args[0])
	if err != nil {
		return nil, err
	}
	if err := newQuery(r.Request).err(); err != nil {
		return nil, err
	}
	var req jobRunRequest
	if err := decodeBody(r.Request, &req, true); err != nil {
		return nil, err
	}
	if req.Seconds < 0 || time.Duration(req.Seconds)*time.Second > MaxJobSlice {
		return nil, badRequest([]*event.FieldError{{Field: "seconds", Rule: fmt.Sprintf("an integer from 1 to %d (default %d)", int(MaxJobSlice.Seconds()), int(DefaultJobSlice.Seconds()))}})
	}
	slice := DefaultJobSlice
	if req.Seconds > 0 {
		slice = time.Duration(req.Seconds) * time.Second
	}
	j, err := jb.load(r.Context(), id)
	if err != nil {
		return nil, err
	}
	if err := jb.g.authorize(r, audit.ReplayJob, RoleOperator, target{Topic: j.Filter.Topic, Consumer: j.Filter.Consumer}); err != nil {
		return nil, err
	}
	busy := false
	if j.State == JobRunning {
		err := jb.work(r.Context(), id, time.Now().Add(slice))
		switch {
		case errors.Is(err, errLeaseLost):
			busy = true
		case errors.Is(err, errWorkerStopped):
		case err != nil:
			return nil, err
		}
		if j, err = jb.load(r.Context(), id); err != nil {
			return nil, err
		}
	}
	return struct {
		jobView
		Busy bool `json:"busy,omitempty"`
	}{j.view(jb.now()), busy}, nil
}

// errLeaseLost means another worker holds the job; errWorkerStopped that
// the worker stopped dead (stopAfter).
var (
	errLeaseLost     = errors.New("replay job: another worker holds the lease")
	errWorkerStopped = errors.New("replay job: worker stopped")
)

// lease takes (or renews, or with progress, writes) the job's lease for
// owner in a transaction: it fails with errLeaseLost when another owner's
// lease is live. It returns the job as stored before the write; when the
// job is no longer running, nothing is written.
func (jb *replayJobs) lease(ctx context.Context, id, owner string, progress *replayJob) (replayJob, error) {
	var cur replayJob
	err := jb.client.RunTransaction(ctx, func(ctx context.Context, tx *firestore.Transaction) error {
		ref := jb.col().Doc(id)
		snap, err := tx.Get(ref)
		if err != nil {
			return err
		}
		cur = replayJob{}
		if err := snap.DataTo(&cur); err != nil {
			return err
		}
		cur.ID = id
		now := jb.now().UTC()
		if cur.State != JobRunning {
			return nil
		}
		if cur.Owner != owner && cur.Owner != "" && now.Before(cur.LeaseUntil) {
			return errLeaseLost
		}
		next := cur
		if progress != nil {
			next = *progress
		}
		next.Owner, next.LeaseUntil, next.UpdatedAt = owner, now.Add(JobLease), now
		if next.Released {
			next.LeaseUntil = now
		}
		return tx.Set(ref, next)
	})
	return cur, err
}

// work runs the job until it is done or cancelled, its lease is lost
// (errLeaseLost: another worker holds it), or until passes: then it
// writes its progress and releases the lease.
func (jb *replayJobs) work(ctx context.Context, id string, until time.Time) error {
	owner := newJobID(jb.now())
	j, err := jb.lease(ctx, id, owner, nil)
	if err != nil || j.State != JobRunning {
		return err
	}
	if j.Owner != "" && !j.Released {
		// Picked up after another worker: count what it sent from its
		// sends, which may be ahead of its last progress write.
		if err := jb.recount(ctx, &j); err != nil {
			return err
		}
		j.Resumed++
	}
	j.Owner, j.Released = owner, false
	f := j.Filter
	interval := time.Duration(float64(time.Second) / j.Rate)
	next := time.Now()
	lastWrite := time.Now()
	sends := 0
	write := func() (bool, error) {
		cur, err := jb.lease(ctx, id, owner, &j)
		if err != nil {
			return false, err
		}
		lastWrite = time.Now()
		if cur.State == JobRunning {
			return true, nil
		}
		// Cancelled meanwhile: its counters get what this worker sent
		// since its last write.
		_, err = jb.col().Doc(id).Update(ctx, []firestore.Update{{Path: "sent", Value: j.Sent}, {Path: "failed", Value: j.Failed},
			{Path: "skipped", Value: j.Skipped}, {Path: "startedAt", Value: j.StartedAt}})
		return false, err
	}
	for {
		page, err := jb.reader.List(ctx, ledgerquery.ListQuery{Topic: f.Topic, From: f.Since, To: f.Until, PageSize: 100, PageToken: j.PageToken})
		if err != nil {
			return jb.pause(ctx, &j, err)
		}
		for i := range page.Events {
			d := &page.Events[i]
			if _, ok := f.match(d); !ok {
				continue
			}
			if time.Since(lastWrite) >= time.Second {
				if running, err := write(); err != nil || !running {
					return err
				}
			}
			if ctx.Err() != nil {
				return jb.pause(ctx, &j, ctx.Err())
			}
			if !time.Now().Before(until) {
				// The slice is over: progress written, lease released.
				j.Released = true
				_, err := jb.lease(ctx, id, owner, &j)
				return err
			}
			if jb.stopAfter > 0 && sends >= jb.stopAfter {
				return errWorkerStopped
			}
			// The cursor: an event this job sent (or began to) is never sent again.
			ref := jb.col().Doc(id).Collection(JobSendsCollection).Doc(model.EventDocID(d.EventID))
			if wait := time.Until(next); wait > 0 {
				t := time.NewTimer(wait)
				select {
				case <-ctx.Done():
					t.Stop()
					return jb.pause(ctx, &j, ctx.Err())
				case <-t.C:
				}
			}
			at := jb.now().UTC()
			s := jobSend{EventID: d.EventID, At: at, State: "sending", Via: map[string]string{FilterFailed: "repush", FilterDeadLettered: "replay"}[f.Outcome]}
			if _, err := ref.Create(ctx, s); status.Code(err) == codes.AlreadyExists {
				continue
			} else if err != nil {
				return jb.pause(ctx, &j, err)
			}
			next = time.Now().Add(interval)
			if j.StartedAt.IsZero() {
				j.StartedAt = at
			}
			sends++
			// A send begun is finished even if the caller leaves.
			s.State, s.Detail = jb.send(context.WithoutCancel(ctx), &j, d.EventID)
			switch s.State {
			case "sent":
				j.Sent++
			case "skipped":
				j.Skipped++
			default:
				j.Failed++
				j.LastError = d.EventID + ": " + s.Detail
			}
			if _, err := ref.Set(context.WithoutCancel(ctx), s); err != nil {
				return jb.pause(ctx, &j, err)
			}
		}
		if page.NextPageToken == "" {
			break
		}
		j.PageToken = page.NextPageToken
		if running, err := write(); err != nil || !running {
			return err
		}
	}
	j.State, j.FinishedAt = JobDone, jb.now().UTC()
	if _, err := jb.lease(ctx, id, owner, &j); err != nil {
		return err
	}
	jb.finished(j)
	return nil
}

// send sends one event to the job's consumer and says how it went:
// sent, skipped (already on its way) or failed, with a detail.
func (jb *replayJobs) send(ctx context.Context, j *replayJob, eventID string) (string, string) {
	f := j.Filter
	if f.Outcome == FilterDeadLettered {
		letters, err := jb.letters.store.ByEvent(ctx, eventID, archive.Filter{Topic: f.Topic, Consumer: f.Consumer})
		if err != nil {
			jb.logger.ErrorContext(ctx, "dlqreplay: replay job could not list dead letters", "job", j.ID, "event", eventID, "error", err.Error())
			return "failed", "the dead-letter archive could not be read"
		}
		if len(letters) == 0 {
			return "failed", "no archived dead letter of it for " + f.Consumer
		}
		l := letters[0] // the newest
		if !l.PayloadKept() {
			return "failed", notKept(l).Error()
		}
		msgID, err := jb.letters.publishReplay(ctx, l)
		if err != nil {
			jb.logger.ErrorContext(ctx, "dlqreplay: replay job could not publish", "job", j.ID, "event", eventID, "error", err.Error())
			return "failed", "publishing the replay failed"
		}
		if err := jb.letters.store.AddReplay(ctx, l.ID, archive.Replay{By: j.CreatedBy + " (" + j.ID + ")", At: jb.now().UTC(), MessageID: msgID, Consumer: f.Consumer}); err != nil {
			jb.logger.WarnContext(ctx, "dlqreplay: replay job could not mark a letter replayed", "job", j.ID, "letter", l.ID, "error", err.Error())
		}
		return "sent", "replayed dead letter " + l.ID + " as message " + msgID
	}
	now := jb.now().UTC()
	d, err := jb.events.ledger.BeginRepush(ctx, eventID, f.Consumer, func(d model.Event) error {
		if e := jb.events.repushRule(d, now); e != nil {
			return e
		}
		return nil
	}, now)
	var ae *apiError
	if errors.As(err, &ae) {
		return "failed", ae.Msg
	}
	if err != nil {
		jb.logger.ErrorContext(ctx, "dlqreplay: replay job could not record a re-push", "job", j.ID, "event", eventID, "error", err.Error())
		return "failed", "the ledger could not record the re-push"
	}
	e, err := d.Envelope()
	if err != nil {
		return "failed", "its payload was too large for the ledger: re-push it from the producer's outbox"
	}
	ctx, span := forcedSpan(ctx, "repush "+d.Topic, e.TraceID, e.SpanID,
		telemetry.KeyDestination.String(d.Topic), telemetry.KeyConsumer.String(f.Consumer), telemetry.KeyEventID.String(eventID))
	_, err = outbox.Repush(ctx, jb.events.outbox, &e, f.Consumer)
	span.End(err)
	switch {
	case errors.Is(err, outbox.ErrPending):
		return "skipped", "still pending in the outbox"
	case err != nil:
		jb.logger.ErrorContext(ctx, "dlqreplay: replay job could not queue a re-push", "job", j.ID, "event", eventID, "error", err.Error())
		return "failed", "queueing the re-push in the outbox failed"
	}
	return "sent", "re-push queued in the outbox for " + f.Consumer
}

// recount sets the job's counters from its sends (a send cut short by a
// crash, still "sending", counts as sent: it may have gone out).
func (jb *replayJobs) recount(ctx context.Context, j *replayJob) error {
	j.Sent, j.Failed, j.Skipped = 0, 0, 0
	it := jb.col().Doc(j.ID).Collection(JobSendsCollection).Select("state").Documents(ctx)
	defer it.Stop()
	for {
		snap, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return nil
		}
		if err != nil {
			return err
		}
		switch st, _ := snap.DataAt("state"); st {
		case "failed":
			j.Failed++
		case "skipped":
			j.Skipped++
		default:
			j.Sent++
		}
	}
}

// pause stops a slice on a store's error or the caller's leaving: the
// progress is written and the lease released (best effort: otherwise it
// lapses), and the job stays running for the next POST /jobs/{id}:run.
func (jb *replayJobs) pause(ctx context.Context, j *replayJob, cause error) error {
	j.Released = true
	if _, err := jb.lease(context.WithoutCancel(ctx), j.ID, j.Owner, j); err != nil {
		jb.logger.Error("dlqreplay: replay job's progress not written", "job", j.ID, "error", err.Error())
	}
	return cause
}

// finished writes the job's outcome to the audit log, under its started
// entry (best effort: the started entry stands for the job).
func (jb *replayJobs) finished(j replayJob) {
	e := audit.Entry{Action: audit.ReplayJob, By: j.CreatedBy, Topic: j.Filter.Topic, ConsumerID: j.Filter.Consumer, Ref: j.AuditRef,
		Outcome: audit.OutcomeSucceeded, Detail: fmt.Sprintf("job %s %s: %d sent, %d failed, %d skipped of %d matched", j.ID, j.State, j.Sent, j.Failed, j.Skipped, j.Matched)}
	if j.State == JobCancelled {
		e.Detail += " (cancelled by " + j.CancelledBy + ")"
	}
	if _, err := jb.audit.Append(context.Background(), e); err != nil {
		jb.logger.Error("dlqreplay: replay job's audit outcome not written", "job", j.ID, "error", err.Error())
	}
	jb.logger.Info("dlqreplay: replay job ended", "job", j.ID, "state", j.State, "sent", j.Sent, "failed", j.Failed, "skipped", j.Skipped, "matched", j.Matched)
}
