package dlqreplay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/relaybus/relaybus/internal/forwarders"
	"github.com/relaybus/relaybus/internal/inbox"
	"github.com/relaybus/relaybus/internal/ledger/audit"
	"github.com/relaybus/relaybus/internal/ledger/consumers"
	"github.com/relaybus/relaybus/internal/names"
	"github.com/relaybus/relaybus/internal/registry"
	"github.com/relaybus/relaybus/internal/telemetry"
	"github.com/relaybus/relaybus/shared/topology"
)

// consumerRegistry serves the topic_consumers registry: the consumers
// each topic's events wait for, with what the topology says of each, and
// the operators' edits of it (add, enable, disable, describe).
type consumerRegistry struct {
	registry *consumers.Registry
	// topology and subs describe each entry (nil: the registry alone).
	topology *topology.Topology
	subs     *topology.SubscriptionMap
	// pauser and pull tell whether a push consumer is paused.
	pauser Pauser
	pull   pullSet
	// forwarders finds the forwarders added at run time (nil: none),
	// listed with their subscriptions and pause.
	forwarders *forwarderAPI
	// dbs are the consumers' databases, where who paused a push consumer
	// is recorded (inbox.PushPauseOf).
	dbs databases
	// auditLog holds the registry's history: listed with it, and where a
	// change's own entry is appended when the registry could not write
	// it in its transaction.
	auditLog AuditLog
	g        *guard
	logger   *slog.Logger
}

// consumerView is a registry entry with what the topology says of it.
type consumerView struct {
	consumers.ConsumerEntry
	// InRegistry is false for a consumer the topology declares but
	// topic_consumers lacks (the deploy's sync has not run).
	InRegistry bool `json:"inRegistry"`
	// Declared is false for an entry no subscription in the topology
	// delivers to: events expecting it wait for it forever.
	Declared           bool   `json:"declared"`
	Subscription       string `json:"subscription,omitempty"`
	PubSubSubscription string `json:"pubsubSubscription,omitempty"`
	Delivery           string `json:"delivery,omitempty"`
	Handler            string `json:"handler,omitempty"`
	Database           string `json:"database,omitempty"`
	// Owner says who the entry follows: "topology" (the deploy's sync
	// keeps it as infra/topology.yaml says) or "operator" (edited here or
	// in the console: the sync never rewrites nor disables it).
	Owner string `json:"owner"`
	// Paused is whether the consumer is paused (pause.go): a push
	// consumer's subscription with its push endpoint detached, any other
	// by its own flag; absent when it could not be read.
	Paused *bool `json:"paused,omitempty"`
	// PausedBy says who paused it: operator, or breaker (its forward
	// target is down; consume's probe resumes it once the target answers).
	PausedBy string `json:"pausedBy,omitempty"`
	// Flow is a declared consumer's flow control as the topology sets it.
	Flow *consumerFlow `json:"flow,omitempty"`
}

// consumerFlow is a consumer's flow-control limits (topology
// max_in_flight, max_per_second, max_instances; 0 is unset: the
// deployment's defaults, no rate limit), and whether it is at them as its
// consume instances report it (relaybus_inbox_flow: an instance writes
// its report, at most every few seconds, only after a delivery had to
// wait or was refused). The metrics relaybus.consume.flow.in_flight and
// relaybus.consume.flow.at_limit (AtLimitMetric) report the same per
// instance.
type consumerFlow struct {
	MaxInFlight   int     `json:"maxInFlight"`
	MaxPerSecond  float64 `json:"maxPerSecond"`
	MaxInstances  int     `json:"maxInstances"`
	AtLimitMetric string  `json:"atLimitMetric"`
	// AtLimit: an instance reported being at a limit within
	// flowAtLimitWindow. LastAtLimit is the latest report's time, and
	// Refused the deliveries its instances refused (each since it
	// started); absent when no instance has reported.
	AtLimit     bool       `json:"atLimit"`
	LastAtLimit *time.Time `json:"lastAtLimit,omitempty"`
	Refused     int64      `json:"refused"`
}

// flowAtLimitWindow is how recent an instance's report must be for its
// consumer to count as at its limits now: three of consume's report
// intervals (5 s).
const flowAtLimitWindow = 15 * time.Second

func (co *consumerRegistry) list(r *request, _ []string) (any, error) {
	q := newQuery(r.Request, "topic")
	topic := q.topic("topic")
	if err := q.err(); err != nil {
		return nil, err
	}
	entries, err := co.registry.Consumers(r.Context())
	if err != nil {
		return nil, err
	}
	out := []consumerView{}
	seen := map[string]bool{}
	for _, e := range entries {
		if topic != "" && e.Topic != topic {
			continue
		}
		v := consumerView{ConsumerEntry: e, InRegistry: true}
		co.describe(&v)
		seen[e.Topic+"/"+e.ConsumerID] = true
		out = append(out, v)
	}
	if co.topology != nil {
		for _, c := range registry.Consumers(co.topology) {
			if seen[c.Topic+"/"+c.ConsumerID] || (topic != "" && c.Topic != topic) {
				continue
			}
			v := consumerView{ConsumerEntry: consumers.ConsumerEntry{Topic: c.Topic, ConsumerID: c.ConsumerID, Enabled: c.Enabled, SortOrder: c.SortOrder, Description: c.Description}}
			co.describe(&v)
			out = append(out, v)
		}
	}
	co.pausedStates(r, out)
	co.flowStates(r, out)
	logged, err := co.auditLog.List(r.Context(), audit.Query{ActionPrefix: "consumer.", Topic: topic, Limit: 50})
	if err != nil {
		return nil, err
	}
	// The changes made (not the attempts started or refused: GET /audit
	// has those).
	changes := []audit.Entry{}
	for _, e := range logged {
		if e.Outcome == "" || e.Outcome == audit.OutcomeSucceeded && e.Detail != "nothing changed" {
			changes = append(changes, e)
		}
	}
	return map[string]any{"consumers": out, "audit": changes, "cacheNote": "A change applies to events sent after the services' registry caches expire (at most " + registry.DefaultCacheTTL.String() + "); events already sent keep their expected consumers",
		"ownership": ownershipRule}, nil
}

// describe adds the topology's facts to a registry entry.
func (co *consumerRegistry) describe(v *consumerView) {
	v.Owner = "topology"
	if v.UpdatedBy != "" {
		v.Owner = "operator"
	}
	if co.topology == nil {
		return
	}
	for _, c := range co.topology.Consumers() {
		if c.Topic == v.Topic && c.Service == v.ConsumerID {
			v.Declared, v.Subscription, v.Delivery, v.Handler, v.Database = true, c.Subscription(), c.Delivery, c.Handler, c.Database
			v.Flow = &consumerFlow{MaxInFlight: c.MaxInFlight, MaxPerSecond: c.MaxPerSecond, MaxInstances: c.MaxInstances,
				AtLimitMetric: telemetry.MetricFlowAtLimit}
			if real := co.subs.Real(c.Subscription()); real != c.Subscription() {
				v.PubSubSubscription = real
			}
			return
		}
	}
}

type consumerBody struct {
	Topic       string  `json:"topic"`
	ConsumerID  string  `json:"consumerId"`
	Enabled     *bool   `json:"enabled"`
	Description *string `json:"description"`
	SortOrder   *int    `json:"sortOrder"`
}

func (co *consumerRegistry) add(r *request, _ []string) (any, error) {
	if err := newQuery(r.Request).err(); err != nil {
		return nil, err
	}
	var b consumerBody
	if err := decodeBody(r.Request, &b, false); err != nil {
		return nil, err
	}
	return co.apply(r, consumers.ConsumerChange{Topic: b.Topic, ConsumerID: b.ConsumerID, Add: true, Enabled: b.Enabled, Description: b.Description, SortOrder: b.SortOrder})
}

// consumerArgs validates the topic and consumer of a path.
func consumerArgs(r *request, args []string) (string, string, error) {
	if err := newQuery(r.Request).err(); err != nil {
		return "", "", err
	}
	return consumerPath(args)
}

// consumerPath validates the topic and consumer of a path's arguments.
func consumerPath(args []string) (string, string, error) {
	var bad invalid
	if names.ValidateTopic(args[0]) != nil || names.IsDeadLetter(args[0]) {
		bad.add("topic", "%s", names.TopicRule)
	}
	if names.ValidateConsumer(args[1]) != nil {
		bad.add("consumerId", "%s", names.ConsumerRule)
	}
	return args[0], args[1], bad.err()
}

func (co *consumerRegistry) change(r *request, args []string) (any, error) {
	topic, id, err := consumerArgs(r, args)
	if err != nil {
		return nil, err
	}
	var b struct {
		Enabled     *bool   `json:"enabled"`
		Description *string `json:"description"`
		SortOrder   *int    `json:"sortOrder"`
	}
	if err := decodeBody(r.Request, &b, false); err != nil {
		return nil, err
	}
	return co.apply(r, consumers.ConsumerChange{Topic: topic, ConsumerID: id, Enabled: b.Enabled, Description: b.Description, SortOrder: b.SortOrder})
}

func (co *consumerRegistry) enable(r *request, args []string) (any, error) {
	return co.toggle(r, args, true)
}
func (co *consumerRegistry) disable(r *request, args []string) (any, error) {
	return co.toggle(r, args, false)
}

func (co *consumerRegistry) toggle(r *request, args []string, on bool) (any, error) {
	topic, id, err := consumerArgs(r, args)
	if err != nil {
		return nil, err
	}
	if err := decodeBody(r.Request, &struct{}{}, true); err != nil {
		return nil, err
	}
	return co.apply(r, consumers.ConsumerChange{Topic: topic, ConsumerID: id, Enabled: &on})
}

func (co *consumerRegistry) apply(r *request, ch consumers.ConsumerChange) (any, error) {
	if err := ch.Validate(); err != nil {
		return nil, err
	}
	// Adding a consumer changes what every event of the topic waits for:
	// an admin's. Enabling, disabling and describing one is an operator's
	// on it, but leaving a topic without an enabled consumer (its new
	// events are then dropped as SKIPPED) is an admin's on the topic.
	action, role, t := audit.ConsumerDescribe, RoleOperator, target{Topic: ch.Topic, Consumer: ch.ConsumerID}
	switch {
	case ch.Add:
		action, role, t = audit.ConsumerAdd, RoleAdmin, target{Topic: ch.Topic}
	case ch.Enabled != nil && *ch.Enabled:
		action = audit.ConsumerEnable
	case ch.Enabled != nil:
		action = audit.ConsumerDisable
	}
	if err := co.g.authorize(r, action, role, t); err != nil {
		return nil, err
	}
	topicAdmin := co.g.grants(r, RoleAdmin, ch.Topic, "")
	ch.KeepOneEnabled = !topicAdmin
	st, err := co.g.begin(r, audit.Entry{Action: action, Topic: ch.Topic, ConsumerID: ch.ConsumerID, Detail: describeChange(ch)})
	if err != nil {
		return nil, err
	}
	ch.Audit = audit.Entry{Method: r.who.Method, RequestID: r.id, Ref: st.entry.ID}
	entry, logged, err := co.registry.ChangeConsumer(r.Context(), ch, r.who.Name)
	switch {
	case errors.Is(err, consumers.ErrLastConsumer):
		e := fail(http.StatusForbidden, "forbidden", "%s is the last enabled consumer of %s: disabling it would drop every new event of the topic (SKIPPED, written nowhere), which needs the %s role on topic %s; %s has not (docs/security.md)",
			ch.ConsumerID, ch.Topic, RoleAdmin, ch.Topic, r.who.Name)
		e.Missing = &missingRight{Role: RoleAdmin, Topic: ch.Topic, Action: audit.ConsumerDisable}
		st.end(e, "")
		co.g.refused(r, action, target{Topic: ch.Topic}, e.Msg)
		return nil, e
	case errors.Is(err, consumers.ErrConsumerExists):
		err = fail(http.StatusConflict, "exists", "%s already has consumer %s: change it instead", ch.Topic, ch.ConsumerID)
	case errors.Is(err, consumers.ErrConsumerNotFound):
		err = fail(http.StatusNotFound, "not_found", "%s has no consumer %s in topic_consumers", ch.Topic, ch.ConsumerID)
	}
	if err != nil {
		st.end(err, "")
		return nil, err
	}
	v := consumerView{ConsumerEntry: entry, InRegistry: true}
	co.describe(&v)
	out := map[string]any{"consumer": v, "changed": logged != nil}
	if logged == nil {
		st.end(nil, "nothing changed")
	} else {
		// The change's own entry is the outcome: written in its
		// transaction when the audit log shares the ledger's database,
		// else appended now that the change has committed.
		if logged.ID == "" {
			if written, werr := co.auditLog.Append(context.WithoutCancel(r.Context()), *logged); werr != nil {
				co.logger.ErrorContext(r.Context(), "dlqreplay: audit outcome not written; the started entry stands for the action", "action", logged.Action,
					"started_entry", st.entry.ID, "caller", r.who.Name, "request_id", r.id, "error", werr.Error())
			} else {
				logged = &written
			}
		}
		out["audit"] = logged
		co.logger.InfoContext(r.Context(), "dlqreplay: consumer registry changed", "topic", ch.Topic, "consumer", ch.ConsumerID,
			"action", logged.Action, "detail", logged.Detail, "caller", r.who.Name, "auth", r.who.Method, "request_id", r.id)
		if strings.Contains(logged.Detail, consumers.NoConsumerLeft) {
			out["newEvents"] = ch.Topic + " has no enabled consumer now: its new events are SKIPPED (publish answers 200 SKIPPED, Go producers and handlers' Emit skip them; nothing is written or delivered) until a consumer is enabled again"
		}
	}
	if co.topology != nil && !v.Declared {
		out["warning"] = "the topology declares no subscription of " + ch.ConsumerID + " on " + ch.Topic + ": while it is enabled, new events wait for it (SENT) until it reports"
	}
	return out, nil
}

// describeChange says a registry change in words, for its started entry.
func describeChange(ch consumers.ConsumerChange) string {
	var parts []string
	if ch.Add {
		parts = append(parts, "add")
	}
	if ch.Enabled != nil {
		parts = append(parts, fmt.Sprintf("enabled: %v", *ch.Enabled))
	}
	if ch.Description != nil {
		parts = append(parts, fmt.Sprintf("description: %q", *ch.Description))
	}
	if ch.SortOrder != nil {
		parts = append(parts, fmt.Sprintf("sortOrder: %d", *ch.SortOrder))
	}
	return strings.Join(parts, "; ")
}

// ownershipRule is the registry's ownership rule, shown with every listing.
const ownershipRule = "The topology owns the consumers it declares; operators own their edits. A deploy's sync (rollup sync-consumers) creates declared consumers and keeps the ones it wrote as infra/topology.yaml says, but never rewrites nor disables an entry an operator added or changed here (owner: operator)."

// flowStates fills in whether each declared consumer with flow limits is
// at them, from its instances' reports in its database; one whose reports
// cannot be read is left without (and logged).
func (co *consumerRegistry) flowStates(r *request, vs []consumerView) {
	now := time.Now()
	for i := range vs {
		f := vs[i].Flow
		if f == nil || (f.MaxInFlight <= 0 && f.MaxPerSecond <= 0) {
			continue
		}
		db, ok := co.dbs.of(vs[i].Database)
		if !ok || db == nil {
			continue
		}
		reports, err := inbox.FlowReports(r.Context(), db, vs[i].ConsumerID)
		if err != nil {
			co.logger.WarnContext(r.Context(), "dlqreplay: cannot read a consumer's flow reports", "consumer", vs[i].ConsumerID, "error", err.Error(), "request_id", r.id)
			continue
		}
		for _, rep := range reports {
			if f.LastAtLimit == nil || rep.AtLimitAt.After(*f.LastAtLimit) {
				at := rep.AtLimitAt
				f.LastAtLimit = &at
			}
			f.AtLimit = f.AtLimit || now.Sub(rep.AtLimitAt) <= flowAtLimitWindow
			f.Refused += rep.Refused
		}
	}
}

// pausedStates fills Paused and PausedBy: for the push consumers (the
// declared ones, and the forwarders added at run time) from their push
// endpoint and its record, for the others from their own flag (a forward
// consumer delivered by Eventarc is paused there by its circuit breaker).
// One whose state cannot be read is left without (and logged).
func (co *consumerRegistry) pausedStates(r *request, vs []consumerView) {
	co.forwarderViews(r, vs)
	for i := range vs {
		v := &vs[i]
		if v.Subscription == "" {
			continue
		}
		if v.Delivery != topology.DeliveryPush || co.pull.has(v.Subscription) || co.pauser == nil {
			co.flagState(r, v)
			continue
		}
		paused, err := co.pauser.Paused(r.Context(), v.Subscription)
		if err != nil {
			co.logger.WarnContext(r.Context(), "dlqreplay: cannot read a consumer's delivery state", "subscription", v.Subscription, "error", err.Error(), "request_id", r.id)
			continue
		}
		v.Paused = &paused
		if paused {
			v.PausedBy = inbox.PausedByOperator
			if db, ok := co.dbs.of(v.Database); ok && db != nil {
				if p, ok, err := inbox.PushPauseOf(r.Context(), db, v.Subscription); err == nil && ok {
					v.PausedBy = p.By
				}
			}
		}
	}
}

// flagState fills v's pause from its flag, in its database (nothing when
// this API does not reach it, or its consume has not created the table).
func (co *consumerRegistry) flagState(r *request, v *consumerView) {
	db, ok := co.dbs.of(v.Database)
	if !ok || db == nil {
		return
	}
	ps, err := inbox.PausedState(r.Context(), db, v.ConsumerID, v.Topic)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (pe.Code == "42P01" || pe.Code == "42703") {
		return // its consume has not migrated that database yet: not paused
	}
	if err != nil {
		co.logger.WarnContext(r.Context(), "dlqreplay: cannot read a consumer's pause", "consumer", v.ConsumerID, "topic", v.Topic, "error", err.Error(), "request_id", r.id)
		return
	}
	v.Paused, v.PausedBy = &ps.Paused, flagPausedBy(ps)
}

// forwarderViews describes the entries that are forwarders added at run
// time: their subscription (an ordered push one), handler and database.
func (co *consumerRegistry) forwarderViews(r *request, vs []consumerView) {
	fa := co.forwarders
	if fa == nil {
		return
	}
	db, err := fa.db()
	if err != nil {
		return
	}
	fs, err := forwarders.List(r.Context(), db)
	if err != nil {
		co.logger.WarnContext(r.Context(), "dlqreplay: cannot list the forwarders", "error", err.Error(), "request_id", r.id)
		return
	}
	byKey := map[string]forwarders.Forwarder{}
	for _, f := range fs {
		byKey[f.Topic+"/"+f.Name] = f
	}
	for i := range vs {
		v := &vs[i]
		if f, ok := byKey[v.Topic+"/"+v.ConsumerID]; ok && !v.Declared {
			v.Subscription, v.Delivery, v.Handler, v.Database = f.Subscription(), topology.DeliveryPush, topology.HandlerForward, fa.databaseName()
		}
	}
}
