package dlqreplay

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/relaybus/relaybus/internal/ledger/audit"
)

// AuditLog is where the API records who did what: the ledger's audit log
// (ledger.Store.Audit) unless Options.Audit names another store. It only
// appends and lists, so the store behind it can be one the API may append
// to and nobody may rewrite.
type AuditLog interface {
	Append(ctx context.Context, e audit.Entry) (audit.Entry, error)
	List(ctx context.Context, q audit.Query) ([]audit.Entry, error)
}

// actionText says each audited action in words, for 403 messages.
var actionText = map[string]string{
	audit.ConsumerAdd:      "add a consumer",
	audit.ConsumerEnable:   "enable a consumer",
	audit.ConsumerDisable:  "disable a consumer",
	audit.ConsumerDescribe: "change a consumer's description or order",
	audit.LetterReplay:     "replay a dead letter",
	audit.LetterBatch:      "replay dead letters in bulk",
	audit.LetterDelete:     "delete a dead letter",
	audit.LetterArchive:    "archive dead letters",
	audit.EventRepush:      "re-push an event",
	audit.EventCancel:      "cancel a scheduled event",
	audit.Seek:             "seek a subscription",
	audit.Snapshot:         "create a snapshot",
	audit.ConsumerPause:    "pause a consumer",
	audit.ConsumerResume:   "resume a consumer",
	audit.ConsumerRebuild:  "rebuild a consumer's projection",
	audit.GapsSkip:         "skip a strict consumer's missing versions",
	audit.SubjectErase:     "erase a data subject's payloads",
	audit.ReplayJob:        "run a replay job",
	audit.ReplayJobCancel:  "cancel a replay job",
	audit.ForwarderAdd:     "add a forwarder",
	audit.ForwarderChange:  "change a forwarder",
	audit.ForwarderRemove:  "remove a forwarder",
	audit.EventRead:        "read an event's payload",
	audit.LetterRead:       "read a dead letter's message",
	audit.Read:             "read the operations API",
}

// guard is what the front gives the resources of itself: the checks of a
// caller's rights on what they act on (rights.go: authorize, refusals in
// read-only mode) and the audit log's record-before-act (begin, run,
// readPayload, refused). It serves no request and knows no resource.
type guard struct {
	log      AuditLog
	readOnly bool
	logger   *slog.Logger
}

// errAuditUnavailable refuses an action whose audit entry could not be
// written: nothing is done unaudited.
func errAuditUnavailable(r *request) *apiError {
	e := fail(http.StatusServiceUnavailable, "audit_unavailable", "the audit log could not record this action, so it was not taken (request %s); retry later", r.id)
	e.RequestID = r.id
	return e
}

// entry fills what every audit entry of r carries: the verified caller,
// how they were verified, the request id.
func (r *request) entry(e audit.Entry) audit.Entry {
	e.By, e.Method, e.RequestID = r.who.Name, r.who.Method, r.id
	return e
}

// step is an action under way, its start recorded.
type step struct {
	g     *guard
	r     *request
	entry audit.Entry
}

// begin records that the caller starts the action e describes, before it
// is taken. When the entry cannot be written the action is refused (503
// audit_unavailable): an action is never taken unaudited.
func (g *guard) begin(r *request, e audit.Entry) (*step, error) {
	e = r.entry(e)
	e.Outcome = audit.OutcomeStarted
	written, err := g.log.Append(context.WithoutCancel(r.Context()), e)
	if err != nil {
		g.logger.ErrorContext(r.Context(), "dlqreplay: audit entry not written; the action is refused", "action", e.Action,
			"caller", r.who.Name, "request_id", r.id, "error", err.Error())
		return nil, errAuditUnavailable(r)
	}
	return &step{g: g, r: r, entry: written}, nil
}

// end records how the action ended (err nil: succeeded, with detail) and
// logs it. An outcome that cannot be written is logged at ERROR: the
// started entry stands for the action.
func (s *step) end(err error, detail string, attrs ...any) {
	e := s.entry
	e.ID, e.At, e.Ref, e.Outcome = "", time.Time{}, s.entry.ID, audit.OutcomeSucceeded
	if detail != "" {
		e.Detail = detail
	}
	msg := "dlqreplay: " + e.Action + " succeeded"
	if err != nil {
		e.Outcome, msg = audit.OutcomeFailed, "dlqreplay: "+e.Action+" failed"
		var ae *apiError
		if errors.As(err, &ae) {
			e.Detail = ae.Msg
		} else {
			e.Detail = "failed (request " + s.r.id + "; the detail is in the service's log)"
		}
	}
	ctx := s.r.Context()
	s.g.logger.InfoContext(ctx, msg, append(attrs, "caller", s.r.who.Name, "auth", s.r.who.Method, "request_id", s.r.id,
		"topic", e.Topic, "consumer", e.ConsumerID, "detail", e.Detail)...)
	if _, werr := s.g.log.Append(context.WithoutCancel(ctx), e); werr != nil {
		s.g.logger.ErrorContext(ctx, "dlqreplay: audit outcome not written; the started entry stands for the action", "action", e.Action,
			"started_entry", s.entry.ID, "outcome", e.Outcome, "caller", s.r.who.Name, "request_id", s.r.id, "error", werr.Error())
	}
}

// run begins the action e describes, runs do, and ends it with do's
// outcome; do returns the outcome's detail.
func (g *guard) run(r *request, e audit.Entry, do func(s *step) (string, error)) error {
	s, err := g.begin(r, e)
	if err != nil {
		return err
	}
	detail, err := do(s)
	s.end(err, detail)
	return err
}

// refused records a refusal with the verified caller (best effort: the
// request is refused whether or not the entry is written).
func (g *guard) refused(r *request, action string, t target, why string) {
	e := r.entry(audit.Entry{Action: action, Topic: t.Topic, ConsumerID: t.Consumer, Outcome: audit.OutcomeRefused, Detail: why})
	g.logger.WarnContext(r.Context(), "dlqreplay: request refused", "action", action, "caller", r.who.Name, "auth", r.who.Method,
		"request_id", r.id, "topic", t.Topic, "consumer", t.Consumer, "reason", why)
	if _, err := g.log.Append(context.WithoutCancel(r.Context()), e); err != nil {
		g.logger.ErrorContext(r.Context(), "dlqreplay: audit entry of a refusal not written", "action", action, "caller", r.who.Name,
			"request_id", r.id, "error", err.Error())
	}
}

// readPayload records that the caller reads a payload, before it is
// answered; when the entry cannot be written the read is refused.
func (g *guard) readPayload(r *request, e audit.Entry) error {
	e = r.entry(e)
	e.Outcome = audit.OutcomeRead
	if _, err := g.log.Append(context.WithoutCancel(r.Context()), e); err != nil {
		g.logger.ErrorContext(r.Context(), "dlqreplay: audit entry of a payload read not written; the read is refused", "action", e.Action,
			"caller", r.who.Name, "request_id", r.id, "error", err.Error())
		return errAuditUnavailable(r)
	}
	return nil
}
