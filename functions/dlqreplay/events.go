package dlqreplay

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"time"

	ledgerquery "github.com/relaybus/relaybus/internal/ledger/query"

	"github.com/relaybus/relaybus/internal/ledger"
	"github.com/relaybus/relaybus/internal/ledger/audit"
	"github.com/relaybus/relaybus/internal/ledger/model"

	"github.com/relaybus/relaybus/internal/archive"
	"github.com/relaybus/relaybus/internal/names"
	"github.com/relaybus/relaybus/internal/telemetry"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/postgres"
)

// events serves the ledger's events: listing and reading them (with every
// attempt, their outbox row, family and dead letters), their traces, and
// re-pushing one through the producers' outbox under the re-push rules.
type events struct {
	// personal applies the console's privacy mode (erase.go).
	personal *personal
	reader   *ledgerquery.Reader
	// ledger marks the re-push (BeginRepush), outbox queues it: the
	// producers' outbox in the main database.
	ledger *ledger.Store
	outbox postgres.DBTX
	// deadLetters lists an event's dead letters.
	deadLetters *archive.Store
	// dbs are the outboxes an event's row is looked for in.
	dbs databases
	// maxRepushes and sentTimeout are the re-push rules.
	maxRepushes int
	sentTimeout time.Duration
	g           *guard
	logger      *slog.Logger
	// scheduled serves the outboxes' scheduled events (scheduled.go).
	scheduled *scheduled
}

// eventRow is one event of a listing with its "n/m consumed".
type eventRow struct {
	model.Event
	// Consumed counts the expected consumers whose latest attempt
	// succeeded; Expected counts the expected consumers.
	Consumed int `json:"consumed"`
	Expected int `json:"expected"`
}

func (ev *events) list(r *request, _ []string) (any, error) {
	q := newQuery(r.Request, "status", "topic", "eventType", "service", "traceId", "aggregateId", "from", "to", "pageSize", "pageToken")
	sq := ledgerquery.SearchQuery{
		ListQuery: ledgerquery.ListQuery{
			Status: q.status("status"), Topic: q.topic("topic"), InitiatorService: q.str("service", validService, ruleService),
			TraceID: q.str("traceId", validTrace, ruleToken), From: q.time("from"), To: q.time("to"),
			PageSize: q.integer("pageSize", 1, ledgerquery.MaxPageSize), PageToken: q.str("pageToken", validPageToken, rulePageToken),
		},
		EventType:   q.str("eventType", validEventType, ruleEventType),
		AggregateID: q.str("aggregateId", validAggregate, ruleAggregateID),
	}
	if !sq.From.IsZero() && !sq.To.IsZero() && !sq.From.Before(sq.To) {
		q.bad.add("to", "must be later than from")
	}
	if err := q.err(); err != nil {
		return nil, err
	}
	p, err := ev.reader.Search(r.Context(), sq)
	if err != nil {
		return nil, err
	}
	consumed, err := ev.reader.ConsumedCounts(r.Context(), p.Events)
	if err != nil {
		return nil, err
	}
	rows := make([]eventRow, 0, len(p.Events))
	for _, e := range p.Events {
		rows = append(rows, eventRow{Event: e, Consumed: consumed[e.EventID], Expected: len(e.ExpectedConsumers)})
	}
	return map[string]any{"events": rows, "nextPageToken": p.NextPageToken}, nil
}

func eventID(r *request, raw string) (string, error) {
	if err := newQuery(r.Request).err(); err != nil {
		return "", err
	}
	if !validEventID(raw) {
		return "", badRequest([]*event.FieldError{{Field: "id", Rule: ruleEventID}})
	}
	return raw, nil
}

// eventSummary is an event as the parent and children of a view show it.
type eventSummary struct {
	EventID     string       `json:"eventId"`
	EventType   string       `json:"eventType"`
	Topic       string       `json:"topic"`
	AggregateID string       `json:"aggregateId"`
	Version     int64        `json:"version"`
	Status      model.Status `json:"status"`
	OccurredAt  time.Time    `json:"occurredAt"`
}

func summaryOf(e model.Event) eventSummary {
	return eventSummary{EventID: e.EventID, EventType: e.EventType, Topic: e.Topic, AggregateID: e.AggregateID, Version: e.Version, Status: e.Status, OccurredAt: e.OccurredAt}
}

// outboxView is an event's row in an outbox.
type outboxView struct {
	Database    string    `json:"database"`
	State       string    `json:"state"`
	Attempts    int       `json:"attempts"`
	PublishedAt time.Time `json:"publishedAt,omitzero"`
	LastError   string    `json:"lastError,omitempty"`
}

// repushAnswer is what the re-push rules say about an event now.
type repushAnswer struct {
	Allowed bool   `json:"allowed"`
	Code    string `json:"code,omitempty"`
	Message string `json:"message"`
}

func (ev *events) get(r *request, args []string) (any, error) {
	id, err := eventID(r, args[0])
	if err != nil {
		return nil, err
	}
	d, err := ev.reader.Get(r.Context(), id)
	if err != nil {
		return nil, mapErr(err)
	}
	// The payload: a viewer of the event's topic (or of one of its
	// consumers) reads it, and the read is recorded before the answer.
	if err := ev.g.authorizeAny(r, audit.EventRead, RoleViewer, d.Event.Topic, d.Event.ExpectedConsumers); err != nil {
		return nil, err
	}
	if err := ev.g.readPayload(r, audit.Entry{Action: audit.EventRead, EventID: id, Topic: d.Event.Topic}); err != nil {
		return nil, err
	}
	view, err := eventJSON(ev.personal.console(d.Event))
	if err != nil {
		return nil, err
	}
	out := map[string]any{"event": view, "consumers": d.Consumers, "expected": d.Expected, "reported": d.Reported,
		"succeeded": d.Succeeded, "summary": d.Summary()}
	if out["consumers"] == nil {
		out["consumers"] = []ledgerquery.ConsumerReport{}
	}
	out["outbox"] = ev.outboxState(r.Context(), id)
	parent, children := ev.family(r.Context(), d.Event)
	out["parent"], out["children"] = parent, children
	letters, _, err := ev.deadLetters.List(r.Context(), archive.Filter{EventID: id}, 50, "")
	if err != nil {
		ev.logger.WarnContext(r.Context(), "dlqreplay: dead letters of an event not read", "event_id", id, "error", err.Error())
		letters = nil
	}
	ids := []map[string]string{}
	for _, l := range letters {
		ids = append(ids, map[string]string{"id": l.ID, "consumer": l.Consumer, "reason": l.Reason})
	}
	out["deadLetters"] = ids
	out["repush"] = ev.repushAnswer(d.Event, time.Now().UTC())
	return out, nil
}

// eventJSON is the event as the API shows it: a JSON payload as JSON,
// another as base64 with its type (payloadEncoding says which), and an
// initiator filled from what is known when the producer gave none (the
// initiator can always be shown).
func eventJSON(e model.Event) (map[string]json.RawMessage, error) {
	payload := e.Payload
	e.Payload = nil
	b, err := json.Marshal(e)
	if err != nil {
		return nil, err
	}
	m := map[string]json.RawMessage{}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	raw := func(v any) json.RawMessage { b, _ := json.Marshal(v); return b }
	switch {
	case e.PayloadOmitted:
		m["payloadEncoding"] = raw("omitted")
	case e.PayloadErased:
		m["payloadEncoding"] = raw("erased")
	case e.PayloadWithheld:
		m["payloadEncoding"] = raw("withheld")
	case event.IsJSONType(e.PayloadType) && json.Valid(payload):
		m["payload"], m["payloadEncoding"] = json.RawMessage(payload), raw("json")
	default:
		m["payload"], m["payloadEncoding"] = raw(base64.StdEncoding.EncodeToString(payload)), raw("base64")
	}
	if e.Initiator == (model.Initiator{}) {
		in := model.Initiator{Service: e.Source}
		from := []string{"source"}
		if e.CorrelationID != "" {
			in.ClientRequestID = e.CorrelationID
			from = append(from, "correlationId")
		}
		m["initiator"], m["initiatorDerivedFrom"] = raw(in), raw(from)
	}
	return m, nil
}

// outboxState finds the event's row in the outboxes dlqreplay reaches (nil
// when none holds it: retention deleted it, or another database does).
func (ev *events) outboxState(ctx context.Context, id string) *outboxView {
	dbs := ev.dbs.all()
	for _, name := range sortedKeys(dbs) {
		got, err := outbox.Lookup(ctx, dbs[name], id)
		if err != nil {
			ev.logger.WarnContext(ctx, "dlqreplay: outbox lookup failed", "database", name, "event_id", id, "error", err.Error())
			continue
		}
		if e, ok := got[id]; ok {
			return &outboxView{Database: name, State: string(e.State), Attempts: e.Attempts, PublishedAt: e.PublishedAt, LastError: e.LastError}
		}
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return sortedStrings(out)
}

// family returns an event's parent and children from its trace.
func (ev *events) family(ctx context.Context, e model.Event) (*eventSummary, []eventSummary) {
	children := []eventSummary{}
	tr, err := ev.reader.Trace(ctx, e.EventID)
	if err != nil {
		ev.logger.WarnContext(ctx, "dlqreplay: trace of an event not read", "event_id", e.EventID, "error", err.Error())
		return nil, children
	}
	var parent *eventSummary
	var walk func(ns []*ledgerquery.TraceNode, up *ledgerquery.TraceNode)
	walk = func(ns []*ledgerquery.TraceNode, up *ledgerquery.TraceNode) {
		for _, n := range ns {
			if n.Event.EventID == e.EventID {
				if up != nil {
					p := summaryOf(up.Event)
					parent = &p
				}
				for _, c := range n.Children {
					children = append(children, summaryOf(c.Event))
				}
			}
			walk(n.Children, n)
		}
	}
	walk(tr.Roots, nil)
	return parent, children
}

func (ev *events) trace(r *request, args []string) (any, error) {
	id, err := eventID(r, args[0])
	if err != nil {
		return nil, err
	}
	t, err := ev.reader.Trace(r.Context(), id)
	return t, mapErr(err)
}

type repushRequest struct {
	Consumer string `json:"consumer"`
	DryRun   bool   `json:"dryRun"`
}

// repushRule applies the re-push rules (docs/operations.md "Replay and
// re-push rules") to an event.
func (ev *events) repushRule(d model.Event, now time.Time) *apiError {
	id := d.EventID
	switch {
	case d.PayloadErased:
		return fail(http.StatusGone, "erased", "event %s's payload was erased (its data subject's erasure) and is not re-pushed", id)
	case !d.ExpireAt.IsZero() && now.After(d.ExpireAt):
		return fail(http.StatusConflict, "expired", "event %s expired at %s and is not re-pushed", id, d.ExpireAt.Format(time.RFC3339))
	case d.RetryCount >= ev.maxRepushes:
		return fail(http.StatusConflict, "max_repushes", "event %s was re-pushed %d times, the most allowed", id, d.RetryCount)
	case d.Status == model.StatusFailed || d.Status == model.StatusRetrying || d.Status == model.StatusPartial:
		return nil
	case d.Status == model.StatusSent && now.Sub(d.LastSentAt) >= ev.sentTimeout:
		return nil
	case d.Status == model.StatusSent:
		return fail(http.StatusConflict, "too_recent", "event %s was sent %s ago; SENT events are re-pushed after %s", id, now.Sub(d.LastSentAt).Round(time.Second), ev.sentTimeout)
	}
	return fail(http.StatusConflict, "status", "event %s is %s; only FAILED, RETRYING, PARTIAL or long-SENT events are re-pushed", id, d.Status)
}

func (ev *events) repushAnswer(d model.Event, now time.Time) repushAnswer {
	if err := ev.repushRule(d, now); err != nil {
		return repushAnswer{Code: err.Code, Message: err.Msg}
	}
	return repushAnswer{Allowed: true, Message: "the re-push rules allow it"}
}

func (ev *events) repush(r *request, args []string) (any, error) {
	id, err := eventID(r, args[0])
	if err != nil {
		return nil, err
	}
	var req repushRequest
	if err := decodeBody(r.Request, &req, true); err != nil {
		return nil, err
	}
	if req.Consumer != "" && names.ValidateConsumer(req.Consumer) != nil {
		return nil, badRequest([]*event.FieldError{{Field: "consumer", Rule: names.ConsumerRule}})
	}
	now := time.Now().UTC()
	if req.DryRun {
		d, err := ev.reader.Get(r.Context(), id)
		if err != nil {
			return nil, mapErr(err)
		}
		return map[string]any{"eventId": id, "consumer": req.Consumer, "dryRun": true, "rules": ev.repushAnswer(d.Event, now)}, nil
	}
	// The right is on the event's topic (and the consumer it goes to;
	// every consumer needs the topic's).
	cur, err := ev.reader.Get(r.Context(), id)
	if err != nil {
		return nil, mapErr(err)
	}
	if err := ev.g.authorize(r, audit.EventRepush, RoleOperator, target{Topic: cur.Event.Topic, Consumer: req.Consumer}); err != nil {
		return nil, err
	}
	to := req.Consumer
	if to == "" {
		to = "every consumer"
	}
	var d model.Event
	err = ev.g.run(r, audit.Entry{Action: audit.EventRepush, EventID: id, Topic: cur.Event.Topic, ConsumerID: req.Consumer,
		Detail: "re-push to " + to + " through the outbox"}, func(*step) (string, error) {
		check := func(d model.Event) error {
			if err := ev.repushRule(d, now); err != nil {
				return err
			}
			return nil
		}
		var err error
		d, err = ev.ledger.BeginRepush(r.Context(), id, req.Consumer, check, now)
		if err != nil {
			return "", mapErr(err)
		}
		e, err := d.Envelope()
		if err == nil && !whole(d) && ev.outboxState(r.Context(), id) == nil {
			return "", fail(http.StatusConflict, "payload_redacted", "event %s's row left the outbox and the ledger keeps its payload redacted (the topic's privacy rule): it cannot be re-pushed whole", id)
		}
		if err != nil {
			return "", fail(http.StatusConflict, "payload_omitted", "event %s's payload was too large for the ledger: re-push it from the producer's outbox", id)
		}
		// The outbox row keeps the re-push span's traceparent, sampled
		// whatever the ratio: the relay's publish and every consumer's
		// delivery of the re-push are recorded under it.
		ctx, span := forcedSpan(r.Context(), "repush "+d.Topic, e.TraceID, e.SpanID,
			telemetry.KeyDestination.String(d.Topic), telemetry.KeyConsumer.String(req.Consumer), telemetry.KeyEventID.String(id))
		_, err = outbox.Repush(ctx, ev.outbox, &e, req.Consumer)
		span.End(err)
		if err != nil && !errors.Is(err, outbox.ErrPending) {
			return "", err
		}
		return "re-pushed to " + to + " through the outbox", nil
	})
	if err != nil {
		return nil, err
	}
	return map[string]any{"eventId": id, "status": model.StatusRetrying, "retryCount": d.RetryCount, "consumer": req.Consumer}, nil
}
