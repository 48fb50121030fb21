package dlqreplay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/relaybus/relaybus/internal/cloudevent"
	"github.com/relaybus/relaybus/internal/ledger/model"
	ledgerquery "github.com/relaybus/relaybus/internal/ledger/query"
	"github.com/relaybus/relaybus/internal/traceparent"

	"go.opentelemetry.io/otel/attribute"

	"github.com/relaybus/relaybus/internal/archive"
	"github.com/relaybus/relaybus/internal/delivery"
	"github.com/relaybus/relaybus/internal/inbox"
	"github.com/relaybus/relaybus/internal/ledger/audit"
	"github.com/relaybus/relaybus/internal/ledger/consumers"
	"github.com/relaybus/relaybus/internal/names"
	"github.com/relaybus/relaybus/internal/telemetry"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/postgres"
	"github.com/relaybus/relaybus/shared/projection"
	"github.com/relaybus/relaybus/shared/topology"
)

// MaxBatchReplay is how many letters one bulk replay republishes; the
// answer says how many remain.
const MaxBatchReplay = 500

// letters serves the dead letters: their archive (the DLQ monitors'
// pushes), listing, reading, deleting, and replaying them to the consumer
// that failed them, one or in bulk, with a dry run that predicts what the
// consumer will do.
type letters struct {
	store     *archive.Store
	publisher event.Publisher
	// history is the ledger's events: a letter's event with its attempts.
	history *ledgerquery.Reader
	// registry tells whether the consumer is still expected (dry runs).
	registry *consumers.Registry
	// topology, subs and dbs find the consumer's delivery, handler and
	// database for dry runs (topology nil: none known).
	topology *topology.Topology
	subs     *topology.SubscriptionMap
	dbs      databases
	// archivers may POST /deadletters:archive.
	archivers principals
	g         *guard
	logger    *slog.Logger
}

func (lt *letters) archive(r *request, _ []string) (any, error) {
	if !lt.archivers.allows(r.who) {
		err := fail(http.StatusForbidden, "not_an_archiver", "%s may not archive dead letters: DLQREPLAY_ARCHIVERS lists who may (the DLQ monitors' push identity)", r.who.Name)
		lt.g.refused(r, audit.LetterArchive, target{}, err.Msg)
		return nil, err
	}
	if err := newQuery(r.Request).err(); err != nil {
		return nil, err
	}
	return lt.archiveDelivery(r.Request, r.id)
}

// archiveDelivery archives the dead letter r delivers, pushed by a DLQ
// monitor or fed by the archive's own pull (archivefeed.go).
func (lt *letters) archiveDelivery(r *http.Request, rid string) (any, error) {
	d, err := delivery.Read(r, delivery.DefaultMaxBody)
	if err != nil {
		// Not a delivery: acknowledged (a 4xx would be redelivered forever).
		lt.logger.ErrorContext(r.Context(), "dlqreplay: archive request is not a Pub/Sub delivery", "error", err.Error(), "request_id", rid)
		return map[string]string{"ignored": "not a Pub/Sub delivery: " + clip(err.Error(), 300)}, nil
	}
	// A DLQ monitor subscription names its topic (<topic>.dlq-monitor);
	// otherwise the delivery may (Eventarc's source).
	topic := ""
	if sub := d.Subscription; sub != "" {
		if id := names.ResourceID(sub); strings.HasSuffix(id, names.DeadLetterSuffix+"-monitor") {
			topic = strings.TrimSuffix(id, "-monitor")
		}
	}
	if topic == "" {
		topic = d.Topic()
	}
	if !names.IsDeadLetter(topic) {
		return nil, fail(http.StatusBadRequest, "invalid_argument", "the delivery's topic %q is not a dead-letter topic", clip(topic, 260))
	}
	l, created, err := lt.store.Archive(r.Context(), topic, d.Message)
	if err != nil {
		return nil, err
	}
	if created {
		lt.logger.WarnContext(r.Context(), "dlqreplay: dead letter archived", "dead_letter_id", l.ID, "topic", l.Topic,
			"consumer", l.Consumer, "reason", l.Reason, "event_id", l.EventID, "subscription", l.Subscription)
	}
	return map[string]any{"id": l.ID, "created": created}, nil
}

// letterFilter reads the letter filters of a query.
func letterFilter(q *query) archive.Filter {
	return archive.Filter{Topic: q.topic("topic"), Consumer: q.consumer("consumer"), Reason: q.str("reason", validReason, ruleReason),
		EventID: q.str("eventId", validEventID, ruleEventID), Since: q.time("since"), Until: q.time("until"), Deleted: q.boolean("deleted")}
}

func (lt *letters) list(r *request, _ []string) (any, error) {
	q := newQuery(r.Request, "topic", "consumer", "reason", "eventId", "since", "until", "deleted", "pageSize", "pageToken")
	f := letterFilter(q)
	size := q.integer("pageSize", 1, 500)
	token := q.str("pageToken", validLetterID, rulePageToken)
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until) {
		q.bad.add("until", "must be later than since")
	}
	if err := q.err(); err != nil {
		return nil, err
	}
	if size == 0 {
		size = 50
	}
	letters, next, err := lt.store.List(r.Context(), f, size, token)
	if errors.Is(err, archive.ErrBadPageToken) {
		return nil, badRequest([]*event.FieldError{{Field: "pageToken", Rule: rulePageToken}})
	}
	if err != nil {
		return nil, err
	}
	if letters == nil {
		letters = []archive.Letter{}
	}
	// A listing carries no message data: reading a payload is a read of
	// one letter (GET /deadletters/{id}), authorized on its topic and
	// recorded in the audit log.
	for i := range letters {
		letters[i].Data = nil
	}
	return map[string]any{"deadLetters": letters, "nextPageToken": next}, nil
}

// letterDetail is a letter with its event's ledger history.
type letterDetail struct {
	archive.Letter
	Event *ledgerquery.Detail `json:"ledger,omitempty"`
}

func letterID(r *request, raw string) (string, error) {
	if err := newQuery(r.Request, "dryRun").err(); err != nil {
		return "", err
	}
	if !validLetterID(raw) {
		return "", badRequest([]*event.FieldError{{Field: "id", Rule: ruleLetterID}})
	}
	return raw, nil
}

func (lt *letters) get(r *request, args []string) (any, error) {
	if err := newQuery(r.Request).err(); err != nil {
		return nil, err
	}
	id, err := letterID(r, args[0])
	if err != nil {
		return nil, err
	}
	l, err := lt.store.Get(r.Context(), id)
	if err != nil {
		return nil, mapErr(err)
	}
	if err := lt.g.authorize(r, audit.LetterRead, RoleViewer, target{Topic: l.Topic, Consumer: l.Consumer}); err != nil {
		return nil, err
	}
	if err := lt.g.readPayload(r, audit.Entry{Action: audit.LetterRead, DeadLetterID: id, Topic: l.Topic, ConsumerID: l.Consumer, EventID: l.EventID}); err != nil {
		return nil, err
	}
	out := letterDetail{Letter: l}
	if l.EventID != "" && validEventID(l.EventID) {
		if d, err := lt.history.Get(r.Context(), l.EventID); err == nil {
			out.Event = &d
		}
	}
	return out, nil
}

func (lt *letters) delete(r *request, args []string) (any, error) {
	if err := newQuery(r.Request).err(); err != nil {
		return nil, err
	}
	id, err := letterID(r, args[0])
	if err != nil {
		return nil, err
	}
	cur, err := lt.store.Get(r.Context(), id)
	if err != nil {
		return nil, mapErr(err)
	}
	if err := lt.g.authorize(r, audit.LetterDelete, RoleOperator, target{Topic: cur.Topic, Consumer: cur.Consumer}); err != nil {
		return nil, err
	}
	var l archive.Letter
	err = lt.g.run(r, audit.Entry{Action: audit.LetterDelete, DeadLetterID: id, Topic: cur.Topic, ConsumerID: cur.Consumer, EventID: cur.EventID,
		Detail: "delete (keep as a tombstone)"}, func(*step) (string, error) {
		var err error
		l, err = lt.store.Delete(r.Context(), id, r.who.Name)
		return "deleted (kept as a tombstone)", mapErr(err)
	})
	if err != nil {
		return nil, err
	}
	l.Data = nil
	return l, nil
}

func mapErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, archive.ErrNotFound):
		return fail(http.StatusNotFound, "not_found", "no dead letter has that id")
	case errors.Is(err, model.ErrEventNotFound):
		return fail(http.StatusNotFound, "not_found", "the ledger has no event with that id")
	}
	return err
}

type replayRequest struct {
	DryRun bool `json:"dryRun"`
}

// Outcomes a replay plan predicts.
const (
	// PlanDeliver: the consumer will receive and handle it.
	PlanDeliver = "deliver"
	// PlanNoop: the consumer will receive it and change nothing (its inbox
	// holds the event, or its projection is newer).
	PlanNoop = "noop"
	// PlanBlocked: the consumer will ask for redelivery until earlier
	// versions of the aggregate arrive (and may dead-letter it again).
	PlanBlocked = "blocked"
	// PlanPoison: the message still cannot be decoded; the consumer will
	// dead-letter it again.
	PlanPoison = "poison"
)

// replayPlan is what replaying a letter will do.
type replayPlan struct {
	DeadLetterID string `json:"deadLetterId"`
	Topic        string `json:"topic"`
	Consumer     string `json:"consumer"`
	Subscription string `json:"subscription,omitempty"`
	EventID      string `json:"eventId,omitempty"`
	DryRun       bool   `json:"dryRun"`
	// Outcome is one of the Plan* constants; Summary says it in a sentence
	// and Checks say how it was found.
	Outcome   string      `json:"outcome"`
	Summary   string      `json:"summary"`
	Checks    []planCheck `json:"checks"`
	MessageID string      `json:"messageId,omitempty"`
}

type planCheck struct {
	Check  string `json:"check"`
	Result string `json:"result"`
}

func (lt *letters) replay(r *request, args []string) (any, error) {
	id, err := letterID(r, args[0])
	if err != nil {
		return nil, err
	}
	var req replayRequest
	if err := decodeBody(r.Request, &req, true); err != nil {
		return nil, err
	}
	if r.URL.Query().Get("dryRun") == "true" {
		req.DryRun = true
	} else if v := r.URL.Query().Get("dryRun"); v != "" && v != "false" {
		return nil, badRequest([]*event.FieldError{{Field: "dryRun", Rule: ruleBool}})
	}
	l, err := lt.store.Get(r.Context(), id)
	if err != nil {
		return nil, mapErr(err)
	}
	role := RoleOperator
	if req.DryRun {
		role = RoleViewer
	}
	if err := lt.g.authorize(r, audit.LetterReplay, role, target{Topic: l.Topic, Consumer: l.Consumer}); err != nil {
		return nil, err
	}
	if l.Deleted {
		return nil, fail(http.StatusConflict, "deleted", "dead letter %s was deleted by %s", id, l.DeletedBy)
	}
	if l.Consumer == "" {
		hint := ""
		if strings.HasPrefix(names.ResourceID(l.Subscription), "eventarc-") {
			hint = ": it failed on Eventarc's subscription " + l.Subscription + ", which DLQREPLAY_SUBSCRIPTIONS does not map to a consumer"
		}
		return nil, fail(http.StatusConflict, "no_consumer", "dead letter %s does not say which consumer failed it%s", id, hint)
	}
	plan := lt.plan(r.Context(), l)
	plan.DryRun = req.DryRun
	if req.DryRun {
		return plan, nil
	}
	err = lt.g.run(r, audit.Entry{Action: audit.LetterReplay, DeadLetterID: id, Topic: l.Topic, ConsumerID: l.Consumer, EventID: l.EventID,
		Detail: "replay to " + l.Consumer}, func(*step) (string, error) {
		msgID, err := lt.publishReplay(r.Context(), l)
		if err != nil {
			return "", err
		}
		plan.MessageID = msgID
		if err := lt.store.AddReplay(r.Context(), id, archive.Replay{By: r.who.Name, At: time.Now().UTC(), MessageID: msgID, Consumer: l.Consumer}); err != nil {
			return "", err
		}
		return "replayed to " + l.Consumer + " as message " + msgID, nil
	})
	if err != nil {
		return nil, err
	}
	return plan, nil
}

// publishReplay republishes a letter's original message to its topic,
// addressed to the consumer that failed it.
//
// The replay is a span sampled whatever the ratio (an operator's action
// is always worth its trace), in the event's trace when the letter names
// it; the message carries that span's traceparent, so the consumer's
// delivery of the replay is recorded under it.
func (lt *letters) publishReplay(ctx context.Context, l archive.Letter) (id string, err error) {
	if !l.PayloadKept() {
		return "", notKept(l)
	}
	m := l.Original()
	m.Attributes[topology.TargetConsumerAttr] = l.Consumer
	ctx, span := forcedSpan(ctx, "replay "+l.Topic, m.Attributes[event.AttrTraceID], m.Attributes[event.AttrSpanID],
		telemetry.KeyDestination.String(l.Topic), telemetry.KeyConsumer.String(l.Consumer), telemetry.KeyEventID.String(l.EventID))
	defer func() { span.End(err) }()
	if tp := traceparent.FromContext(ctx); tp != "" {
		m.Attributes[telemetry.AttrTraceparent] = tp
	}
	return lt.publisher.Publish(ctx, l.Topic, m)
}

// notKept is the refusal of a replay of a letter that does not hold the
// event's payload as produced (its topic's privacy rule redacted or
// withheld it in the archive): replaying it would deliver what the rule
// kept, not the event.
func notKept(l archive.Letter) error {
	what := "withholds its payload"
	if len(l.RedactedFields) > 0 {
		what = "keeps its payload with " + strings.Join(l.RedactedFields, ", ") + " redacted"
	}
	return fail(http.StatusConflict, "payload_redacted",
		"dead letter %s %s (topic %s's privacy rule, archive): re-push event %s to %s instead (POST /events/{id}:repush) while its outbox row is kept",
		l.ID, what, l.Topic, l.EventID, l.Consumer)
}

// forcedSpan starts the span of an operator's replay or re-push with
// relaybus.sample.force, so it is recorded whatever the sampling ratio
// (otelsetup.Sampler), in the event's own trace when traceID is a W3C id
// (the console links that id to Cloud Trace): under the event's span when
// the envelope names one, else under a fresh span id (an event published
// with telemetry off has none; Cloud Trace shows the replay at the top of
// the trace). Otherwise it is a root. With telemetry off it does nothing.
func forcedSpan(ctx context.Context, name, traceID, spanID string, attrs ...attribute.KeyValue) (context.Context, telemetry.Span) {
	if spanID == "" {
		spanID = event.NewSpanID()
	}
	tp := ""
	if traceID != "" {
		tp = "00-" + traceID + "-" + spanID + "-00" // ignored unless valid
	}
	return telemetry.Start(ctx, name, telemetry.KindProducer, tp, append(attrs, telemetry.ForceSample.Bool(true))...)
}

// plan predicts what replaying l to its consumer will do. Every check that
// cannot be made says so; none fails the plan.
func (lt *letters) plan(ctx context.Context, l archive.Letter) replayPlan {
	p := replayPlan{DeadLetterID: l.ID, Topic: l.Topic, Consumer: l.Consumer, Subscription: l.Subscription, EventID: l.EventID, Outcome: PlanDeliver}
	add := func(check, format string, args ...any) {
		p.Checks = append(p.Checks, planCheck{Check: check, Result: fmt.Sprintf(format, args...)})
	}
	var c *topology.Consumer
	if lt.topology != nil {
		if tc, ok := lt.subs.Consumer(l.Subscription); ok && tc.Service == l.Consumer {
			c = &tc
		} else {
			for _, tc := range lt.topology.Consumers() {
				if tc.Topic == l.Topic && tc.Service == l.Consumer {
					c = &tc
					break
				}
			}
		}
	}
	switch {
	case c == nil && lt.topology != nil:
		add("delivery", "published to %s with %s=%s; the topology declares no %s on %s, so no subscription may deliver it", l.Topic, topology.TargetConsumerAttr, l.Consumer, l.Consumer, l.Topic)
	case c != nil && c.Delivery == topology.DeliveryEventarc:
		add("delivery", "published to %s with %s=%s; %s's Eventarc trigger (%s) delivers it; other consumers' subscriptions filter it out, other Eventarc consumers acknowledge and skip it",
			l.Topic, topology.TargetConsumerAttr, l.Consumer, l.Consumer, lt.subs.Real(c.Subscription()))
	case c != nil:
		add("delivery", "published to %s with %s=%s; only %s delivers it (every other consumer's subscription filters it out)", l.Topic, topology.TargetConsumerAttr, l.Consumer, c.Subscription())
	default:
		add("delivery", "published to %s with %s=%s: only that consumer handles it", l.Topic, topology.TargetConsumerAttr, l.Consumer)
	}
	orig := l.Original()
	orig.Topic = l.Topic
	e, _, derr := cloudevent.Decode(orig, event.Limits{MaxPayloadBytes: event.MaxPayloadLimit})
	var de *event.DecodeError
	if errors.As(derr, &de) {
		p.Outcome = PlanPoison
		add("decode", "the message still cannot be read as an event (%s): %s will dead-letter it again unless it was fixed to accept it", de.Reason, l.Consumer)
	} else if derr != nil {
		p.Outcome = PlanPoison
		add("decode", "the message cannot be read as an event: %s will dead-letter it again", l.Consumer)
	} else {
		add("decode", "a valid event: %s %s v%d of aggregate %s", e.Type, e.ID, e.Version, e.AggregateID)
	}
	if entries, err := lt.registry.ExpectedConsumers(ctx, l.Topic); err == nil {
		enabled := false
		for _, x := range entries {
			enabled = enabled || x.ConsumerID == l.Consumer
		}
		if !enabled {
			add("registry", "%s is not an enabled consumer of %s in topic_consumers: the ledger does not wait for it, its subscription still delivers", l.Consumer, l.Topic)
		}
	}
	if p.Outcome == PlanPoison {
		p.Summary = fmt.Sprintf("%s will receive it again and dead-letter it again: the message is still poison.", l.Consumer)
		return p
	}
	db, dbName := lt.consumerDB(c)
	switch {
	case db == nil:
		add("inbox", "dlqreplay has no connection to %s's database (%s): its inbox cannot be checked", l.Consumer, dbName)
	default:
		attempt, done, err := applied(ctx, db, l.Consumer, e.ID)
		switch {
		case err != nil:
			lt.logger.WarnContext(ctx, "dlqreplay: dry run could not read an inbox", "consumer", l.Consumer, "database", dbName, "error", err.Error())
			add("inbox", "%s's inbox could not be read", l.Consumer)
		case done:
			p.Outcome = PlanNoop
			add("inbox", "%s's inbox already holds event %s (applied by attempt %d): the replay will be acknowledged as a duplicate and change nothing", l.Consumer, e.ID, attempt)
		default:
			add("inbox", "%s has not applied event %s yet", l.Consumer, e.ID)
		}
	}
	if p.Outcome == PlanDeliver && db != nil && c != nil {
		lt.orderCheck(ctx, db, c, &e, &p, add)
	}
	switch p.Outcome {
	case PlanNoop:
		p.Summary = fmt.Sprintf("%s will receive it and change nothing.", l.Consumer)
	case PlanBlocked:
		p.Summary = fmt.Sprintf("%s will receive it but hold it back until the earlier versions of %s arrive.", l.Consumer, e.AggregateID)
	default:
		p.Summary = fmt.Sprintf("%s alone will receive event %s and handle it.", l.Consumer, e.ID)
	}
	return p
}

// orderCheck compares the event's version with what the consumer's
// version gate holds for its aggregate.
func (lt *letters) orderCheck(ctx context.Context, db postgres.DBTX, c *topology.Consumer, e *event.Event, p *replayPlan, add func(string, string, ...any)) {
	held, err := projection.HeldVersion(ctx, db, c.Handler, c.Service, e.AggregateType, e.AggregateID)
	if errors.Is(err, projection.ErrNoVersionGate) {
		add("order", "handler %s keeps no version gate dlqreplay can read", c.Handler)
		return
	}
	if err != nil {
		lt.logger.WarnContext(ctx, "dlqreplay: dry run could not read a version gate", "consumer", c.Service, "handler", c.Handler, "error", err.Error())
		add("order", "%s's version gate could not be read", c.Service)
		return
	}
	switch {
	case c.Handler == topology.HandlerStrict && e.Version > held+1:
		p.Outcome = PlanBlocked
		add("order", "aggregate %s is at version %d in %s: versions %d to %d must arrive first; until then it asks for redelivery (and may be dead-lettered again)",
			e.AggregateID, held, c.Service, held+1, e.Version-1)
	case e.Version <= held:
		p.Outcome = PlanNoop
		add("order", "%s already holds version %d of %s (≥ %d): the handler will skip it", c.Service, held, e.AggregateID, e.Version)
	default:
		add("order", "%s holds version %d of %s: version %d is next", c.Service, held, e.AggregateID, e.Version)
	}
}

// consumerDB returns the database of a consumer (nil when dlqreplay has no
// connection to it) and its name.
func (lt *letters) consumerDB(c *topology.Consumer) (postgres.DBTX, string) {
	name := topology.MainDatabase
	if c != nil {
		name = c.Database
	}
	if db, ok := lt.dbs.of(name); ok && db != nil {
		return db, name
	}
	return nil, name
}

type batchRequest struct {
	Topic           string `json:"topic"`
	Consumer        string `json:"consumer"`
	Reason          string `json:"reason"`
	Since           string `json:"since"`
	Until           string `json:"until"`
	IncludeReplayed bool   `json:"includeReplayed"`
	DryRun          bool   `json:"dryRun"`
	// Expect, when set, is the count the operator confirmed: the replay is
	// refused when the filter now matches another number.
	Expect *int `json:"expect"`
}

// replayBatch replays every letter matching the filter (at most
// MaxBatchReplay per call; call again for more), each to the consumer that
// failed it. Letters replayed before are skipped unless IncludeReplayed.
func (lt *letters) replayBatch(r *request, _ []string) (any, error) {
	if err := newQuery(r.Request).err(); err != nil {
		return nil, err
	}
	var req batchRequest
	if err := decodeBody(r.Request, &req, false); err != nil {
		return nil, err
	}
	// The body's fields go through the same rules as the listing's.
	vals := map[string][]string{}
	for k, v := range map[string]string{"topic": req.Topic, "consumer": req.Consumer, "reason": req.Reason, "since": req.Since, "until": req.Until} {
		if v != "" {
			vals[k] = []string{v}
		}
	}
	q := &query{v: vals}
	f := letterFilter(q)
	f.Unreplayed = !req.IncludeReplayed
	if req.Topic == "" && req.Consumer == "" && req.Reason == "" {
		q.bad.add("topic", "give at least one of topic, consumer, reason")
	}
	if req.Expect != nil && (*req.Expect < 0 || *req.Expect > archive.MaxSummaryScan) {
		q.bad.add("expect", "an integer from 0 to %d", archive.MaxSummaryScan)
	}
	if err := q.err(); err != nil {
		return nil, err
	}
	role := RoleOperator
	if req.DryRun {
		role = RoleViewer
	}
	if err := lt.g.authorize(r, audit.LetterBatch, role, target{Topic: req.Topic, Consumer: req.Consumer}); err != nil {
		return nil, err
	}
	sum, err := lt.store.Summarize(r.Context(), f)
	if err != nil {
		return nil, err
	}
	out := map[string]any{"matched": sum.Total, "byTopicConsumer": sum.ByTopicConsumer, "dryRun": req.DryRun, "limit": MaxBatchReplay}
	if req.DryRun {
		return out, nil
	}
	if req.Expect != nil && *req.Expect != sum.Total {
		return nil, fail(http.StatusConflict, "count_changed", "you confirmed %d letters, the filter now matches %d: run the dry run again", *req.Expect, sum.Total)
	}
	filter := fmt.Sprintf("topic=%q consumer=%q reason=%q since=%q until=%q includeReplayed=%v", req.Topic, req.Consumer, req.Reason, req.Since, req.Until, req.IncludeReplayed)
	st, err := lt.g.begin(r, audit.Entry{Action: audit.LetterBatch, Topic: req.Topic, ConsumerID: req.Consumer,
		Detail: fmt.Sprintf("replay up to %d of %d letters matching %s", MaxBatchReplay, sum.Total, filter)})
	if err != nil {
		return nil, err
	}
	replayed, skipped, redacted, token := 0, 0, 0, ""
	var pubErr error
	for replayed+skipped+redacted < MaxBatchReplay && pubErr == nil {
		letters, next, err := lt.store.List(r.Context(), f, min(100, MaxBatchReplay-replayed-skipped-redacted), token)
		if err != nil {
			pubErr = err
			break
		}
		for _, l := range letters {
			if l.Consumer == "" {
				skipped++
				continue
			}
			if !l.PayloadKept() { // its topic's privacy rule redacted it in the archive: not the event
				redacted++
				continue
			}
			msgID, err := lt.publishReplay(r.Context(), l)
			if err != nil {
				pubErr = err
				break
			}
			if err := lt.store.AddReplay(r.Context(), l.ID, archive.Replay{By: r.who.Name, At: time.Now().UTC(), MessageID: msgID, Consumer: l.Consumer}); err != nil {
				pubErr = err
				break
			}
			replayed++
		}
		if next == "" {
			break
		}
		token = next
	}
	if pubErr != nil {
		lt.logger.ErrorContext(r.Context(), "dlqreplay: bulk replay stopped", "request_id", r.id, "replayed", replayed, "error", pubErr.Error())
		e := fail(http.StatusServiceUnavailable, "unavailable", "replayed %d of %d letters, then Pub/Sub or the archive failed (request %s): run the replay again for the rest", replayed, sum.Total, r.id)
		e.RequestID = r.id
		st.end(e, "", "filter", filter, "replayed", replayed, "matched", sum.Total)
		return nil, e
	}
	st.end(nil, fmt.Sprintf("replayed %d of %d letters matching %s", replayed, sum.Total, filter), "filter", filter, "replayed", replayed, "matched", sum.Total)
	out["replayed"] = replayed
	out["skippedNoConsumer"] = skipped
	out["skippedRedacted"] = redacted
	out["remaining"] = max(sum.Total-replayed-skipped-redacted, 0)
	return out, nil
}

// applied reports whether consumer's inbox holds eventID, and the attempt
// that applied it (internal/inbox owns the table).
func applied(ctx context.Context, db postgres.DBTX, consumer, eventID string) (int, bool, error) {
	return inbox.Lookup(ctx, db, consumer, eventID)
}
