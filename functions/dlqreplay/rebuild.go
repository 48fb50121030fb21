package dlqreplay

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relaybus/relaybus/internal/history"
	"github.com/relaybus/relaybus/internal/inbox"
	"github.com/relaybus/relaybus/internal/ledger/audit"
	"github.com/relaybus/relaybus/shared/broker"
	"github.com/relaybus/relaybus/shared/postgres"
	"github.com/relaybus/relaybus/shared/projection"
	"github.com/relaybus/relaybus/shared/topology"
)

// Rebuilding a consumer's state (a backfill by seek, as
// docs/operations.md "Rebuild a projection" tells), in one call:
//
//  1. pause the consumer by its control (pause.go: its push endpoint, or
//     its own flag; after a flag, wait PauseSettle for every consume
//     instance to read it), so nothing is applied while its state is
//     cleared;
//  2. seek its subscription to the time or snapshot (consumer subscriptions
//     retain acknowledged messages for their retention period); a refused
//     seek stops here, nothing cleared;
//  3. in its own database, in one transaction: delete its state for the
//     scope (relaybus_projection, a strict consumer's position, parked and
//     skipped rows, all aggregate types or one; a custom handler's declared
//     rebuild_clear tables, whole) and its inbox rows, so the redeliveries
//     are applied instead of answered as duplicates. The inbox has no
//     aggregate type, so all of the consumer's inbox rows go: a redelivered
//     event of another aggregate type meets that aggregate's kept state,
//     and the built-in handlers' version gate makes it a no-op;
//  4. resume it (unless it was paused before), and the broker delivers
//     again everything since that point.
//
// From the event history instead ("history": true), step 2 starts one
// backfill per subscription of the group (internal/history: the topic's
// events since the time, up to now, re-pushed to the consumer alone)
// instead of seeking, and the caller drives them as any backfill
// (POST /backfills/{id}:run; `relaybus consumers rebuild --history`
// drives them to the end). That reaches back as far as the outbox and its
// history keep the topic's events rather than the subscription's
// retention, and it needs no seek from the broker: the same rebuild for
// every consumer kind on Pub/Sub and NATS. A backfill that does not start
// stops the rebuild before anything is cleared; one started for a rebuild
// whose clear then fails is cancelled.
//
// A custom handler that declares no rebuild_clear, and a forward consumer
// (its state is its target's), are refused before anything changes, with
// what cannot be reset. A time older than the subscription's retention
// allows is refused before anything changes. The dry run says what would
// be cleared and replayed.

// retentionMargin keeps a seek clear of the retention's edge: the call
// takes a moment, and a time that falls out of the window meanwhile would
// skip messages silently.
const retentionMargin = 5 * time.Minute

type rebuildBody struct {
	Time          string `json:"time"`
	Snapshot      string `json:"snapshot"`
	AggregateType string `json:"aggregateType"`
	DryRun        bool   `json:"dryRun"`
	// History replays from the event history (backfills) instead of a
	// seek; Database is the database whose outbox holds the topics'
	// events (main by default) and Rate the backfills' events per second
	// (history.DefaultRate by default).
	History  bool     `json:"history"`
	Database string   `json:"database"`
	Rate     *float64 `json:"rate"`
}

// rebuildCounts is what a rebuild clears (or would): the consumer's
// projection state and its inbox rows.
type rebuildCounts struct {
	projection.Cleared
	Inbox int64 `json:"inboxRows"`
	// Tables are a custom handler's tables (rebuild_clear) and their rows.
	Tables map[string]int64 `json:"tables,omitempty"`
}

// String is the counts as the audit log and errors show them.
func (n rebuildCounts) String() string {
	out := fmt.Sprintf("%d projection rows, %d strict positions, %d parked, %d skipped, %d inbox rows", n.Projection, n.Positions, n.Parked, n.Skipped, n.Inbox)
	for t, k := range n.Tables {
		out += fmt.Sprintf(", %d rows of %s", k, t)
	}
	return out
}

// rebuildable says why g's state cannot be reset by a rebuild, or nil:
// the built-in projection and strict handlers' state is relaybus's; a
// custom handler declares its tables (rebuild_clear), cleared whole; a
// forward consumer's effects are its target's.
func rebuildable(g topology.Consumer, aggType, note string) error {
	switch {
	case g.Handler == topology.HandlerProjection || g.Handler == topology.HandlerStrict:
		return nil
	case g.Handler == "forward":
		return fail(http.StatusConflict, "handler", "%s on %s forwards each event to %s: its state is that service's, which relaybus cannot reset. Nothing was changed. To send the events again, seek its subscription (relaybus seek); the target must be idempotent on the event id%s", g.Service, g.Topic, g.ForwardURL, note)
	case len(g.RebuildClear) == 0:
		return fail(http.StatusConflict, "handler", "%s on %s runs handler %q, whose state relaybus cannot reset: it declares no rebuild_clear (the tables its state is in). Nothing was changed: declare them in the topology, or clear them yourself, then pause, seek and resume%s", g.Service, g.Topic, g.Handler, note)
	case aggType != "":
		return fail(http.StatusConflict, "scope", "%s on %s runs handler %q, whose declared tables (%s) are cleared whole: rebuild every aggregate type, not %s%s", g.Service, g.Topic, g.Handler, strings.Join(g.RebuildClear, ", "), aggType, note)
	}
	return nil
}

// clearTable counts (and, unless dryRun, deletes) every row of a custom
// handler's table.
func clearTable(ctx context.Context, tx pgx.Tx, table string, dryRun bool) (int64, error) {
	id := pgx.Identifier(strings.Split(table, ".")).Sanitize()
	if dryRun {
		var n int64
		if err := tx.QueryRow(ctx, "SELECT count(*) FROM "+id).Scan(&n); err != nil {
			return 0, fmt.Errorf("rebuild: count %s: %w", table, err)
		}
		return n, nil
	}
	tag, err := tx.Exec(ctx, "DELETE FROM "+id)
	if err != nil {
		return 0, fmt.Errorf("rebuild: clear %s: %w", table, err)
	}
	return tag.RowsAffected(), nil
}

func (dl *deliveryControl) rebuild(r *request, args []string) (any, error) {
	topic, id, err := consumerArgs(r, args)
	if err != nil {
		return nil, err
	}
	var b rebuildBody
	if err := decodeBody(r.Request, &b, false); err != nil {
		return nil, err
	}
	var bad invalid
	var at time.Time
	switch {
	case b.Time != "" && b.Snapshot == "":
		t, err := time.Parse(time.RFC3339, b.Time)
		if err != nil || t.Before(minTime) || !t.Before(maxTime) {
			bad.add("time", "%s", ruleTime)
		}
		at = t
	case b.Snapshot != "" && b.Time == "":
		if !validSnapshot(b.Snapshot) {
			bad.add("snapshot", "%s", ruleSnapshot)
		}
	default:
		bad.add("time", `give exactly one of "time" (RFC 3339) or "snapshot"`)
	}
	if b.AggregateType != "" && !validAggregate(b.AggregateType) {
		bad.add("aggregateType", "%s", ruleAggregateID)
	}
	outboxName, rate := b.Database, float64(history.DefaultRate)
	if b.History {
		if b.Snapshot != "" {
			bad.add("snapshot", `a rebuild from the history replays from a "time", not a snapshot`)
		}
		if outboxName == "" {
			outboxName = topology.MainDatabase
		}
		if _, ok := dl.dbs.declared(dl.topology, outboxName); !ok {
			bad.add("database", "a database of the topology this API reaches")
		}
		if b.Rate != nil {
			if rate = *b.Rate; rate < 1 || rate > history.MaxRate {
				bad.add("rate", "events per second, from 1 to %d (default %d)", history.MaxRate, history.DefaultRate)
			}
		}
	} else {
		if b.Database != "" {
			bad.add("database", `only with "history": true`)
		}
		if b.Rate != nil {
			bad.add("rate", `only with "history": true`)
		}
	}
	if err := bad.err(); err != nil {
		return nil, err
	}
	role := RoleAdmin
	if b.DryRun {
		role = RoleViewer
	}
	if err := dl.g.authorize(r, audit.ConsumerRebuild, role, target{Topic: topic, Consumer: id}); err != nil {
		return nil, err
	}
	c, err := dl.declared(topic, id)
	if err != nil {
		if f, ok := dl.forwarders.consumer(r.Context(), topic, id); ok {
			return nil, fail(http.StatusConflict, "handler", "%s on %s is a forwarder: it forwards each event to its target, whose state relaybus cannot reset. Nothing was changed. To send it events again, backfill it (POST /backfills with consumer %s, or relaybus backfill); the target must be idempotent on the event id",
				f.Service, f.Topic, f.Service)
		}
		return nil, err
	}
	// Every subscription of this service in this database shares its state
	// (the tables are keyed by consumer id, the service): the rebuild
	// clears it for all of them, so it pauses, seeks and resumes all.
	group := dl.stateSharers(c)
	var subs []string
	for _, g := range group {
		if err := rebuildable(g, b.AggregateType, sharedNote(g, c)); err != nil {
			return nil, err
		}
		subs = append(subs, g.Subscription())
	}
	if b.Snapshot != "" && len(group) > 1 {
		return nil, fail(http.StatusConflict, "snapshot", "%s keeps one state for %s: a snapshot belongs to one subscription's topic, so rebuild them to a time", c.Service, strings.Join(subs, ", "))
	}
	// The shortest retention of the group bounds the seek.
	retention, shortest := time.Duration(dl.topicRetention(c.Topic))*time.Second, c.Subscription()
	for _, g := range group {
		if r := time.Duration(dl.topicRetention(g.Topic)) * time.Second; r < retention {
			retention, shortest = r, g.Subscription()
		}
	}
	if b.Time != "" {
		if earliest := time.Now().Add(-retention + retentionMargin); !b.History && at.Before(earliest) {
			return nil, fail(http.StatusConflict, "retention", "%s retains messages for %s: a seek reaches back to %s at the earliest, not %s", shortest, retention, earliest.UTC().Format(time.RFC3339), b.Time)
		}
		if at.After(time.Now()) {
			return nil, fail(http.StatusConflict, "future", "time %s is in the future: nothing would be replayed", b.Time)
		}
		if b.History {
			if err := dl.historyReaches(group, at, b.Time); err != nil {
				return nil, err
			}
		}
	}
	_, run, err := dl.strictOrProjection(c)
	if err != nil {
		return nil, err
	}
	plan := map[string]any{"topic": c.Topic, "consumer": c.Service, "subscription": c.Subscription(), "subscriptions": subs, "database": c.Database,
		"handler": c.Handler, "scope": scopeOf(b.AggregateType), "time": b.Time, "snapshot": b.Snapshot, "retention": retention.String()}
	// A rebuild from the history: one backfill per subscription of the
	// group, the topic's events since the time up to now (the dry run's
	// counts); the rebuild itself moves until to after its pause
	// (rebuildFromHistory).
	var specs []history.Spec
	if b.History {
		delete(plan, "retention")
		plan["history"], plan["outboxDatabase"] = true, outboxName
		now := time.Now().UTC()
		for _, g := range group {
			specs = append(specs, history.Spec{Topic: g.Topic, Consumer: g.Service, Since: at.UTC(), Until: now, Rate: rate, By: r.who.Name})
		}
	}
	var warnings []string
	if len(group) > 1 {
		warnings = append(warnings, fmt.Sprintf("%s keeps one state for its subscriptions %s (its tables are keyed by the service): all of them are rebuilt together, paused, replayed from the same point, cleared once and resumed", c.Service, strings.Join(subs, ", ")))
	}
	for _, g := range group {
		if g.Handler == topology.HandlerStrict {
			// Its positions start again at 0: an aggregate whose first
			// versions were published before the seek point parks what is
			// replayed behind a gap (list and skip it: gaps.go).
			warnings = append(warnings, "a strict consumer replays every version in order from 1: aggregates whose first versions are older than the seek point will show gaps (relaybus gaps ls)")
			break
		}
	}
	if len(warnings) > 0 {
		plan["warning"] = strings.Join(warnings, "; ")
	}
	if b.DryRun {
		n, err := clearRebuild(r.Context(), run, c, b.AggregateType, false)
		if err != nil {
			return nil, err
		}
		plan["dryRun"], plan["wouldClear"] = true, n
		if b.History {
			replay := map[string]int64{}
			for _, s := range specs {
				k, err := history.Count(r.Context(), dl.dbs.mustOf(outboxName), s)
				if err != nil {
					return nil, err
				}
				replay[s.Topic] = k
			}
			plan["wouldReplay"] = replay
			plan["steps"] = []string{"pause " + strings.Join(subs, ", "), "start a backfill per topic from the history since " + b.Time,
				"clear the counts above in database " + c.Database, "resume; driving the backfills delivers the counts above to " + c.Service + " alone, in order per aggregate"}
			return plan, nil
		}
		plan["steps"] = []string{"pause " + strings.Join(subs, ", "), "seek to " + b.Time + b.Snapshot,
			"clear the counts above in database " + c.Database, "resume: Pub/Sub delivers every message retained since then, in order"}
		return plan, nil
	}
	seeker, canSeek := broker.As[broker.TimeSeeker](dl.broker)
	snaps, canSnap := broker.As[broker.Snapshotter](dl.broker)
	if !b.History && b.Snapshot != "" && !canSnap {
		return nil, fail(http.StatusNotImplemented, "unavailable", "snapshots are Pub/Sub's; on this transport rebuild to a time")
	}
	if !b.History && b.Snapshot == "" && !canSeek {
		return nil, fail(http.StatusNotImplemented, "unavailable", `the broker's administration is not configured (seek); "history": true rebuilds from the event history instead`)
	}
	flagged := false
	for _, g := range group {
		if dl.control(g) == ControlConsumerFlag {
			flagged = true
			if dl.publisher == nil {
				return nil, fail(http.StatusNotImplemented, "unavailable", "%s is paused by its own flag, and resuming it publishes what it kept: no publisher is configured", g.Subscription())
			}
			continue
		}
		if pp, ok := dl.pauser.(*PushPauser); ok {
			if _, ok := pp.Targets[g.Subscription()]; !ok {
				return nil, fail(http.StatusConflict, "no_push_target", "dlqreplay does not know %s's push endpoint (DLQREPLAY_PUSH_TARGETS), so it could not resume it after the rebuild", g.Subscription())
			}
		}
	}
	detail := fmt.Sprintf("rebuild: scope %s, %s to be seeked to %s%s", scopeOf(b.AggregateType), strings.Join(subs, ", "), b.Time, b.Snapshot)
	if b.History {
		detail = fmt.Sprintf("rebuild: scope %s, %s to be backfilled from the history since %s", scopeOf(b.AggregateType), strings.Join(subs, ", "), b.Time)
	}
	err = dl.g.run(r, audit.Entry{Action: audit.ConsumerRebuild, Topic: c.Topic, ConsumerID: c.Service, Subscription: c.Subscription(),
		Detail: detail}, func(*step) (string, error) {
		var paused []topology.Consumer // the consumers this rebuild paused, to resume
		var done []string              // what each pause and resume did
		resume := func() error {
			var errs []error
			for _, g := range paused {
				st, err := dl.setPaused(context.WithoutCancel(r.Context()), g, false, r.who.Name)
				if err != nil {
					errs = append(errs, err)
					continue
				}
				done = append(done, g.Subscription()+": "+st.Done)
			}
			return errors.Join(errs...)
		}
		for _, g := range group {
			st, err := dl.setPaused(r.Context(), g, true, r.who.Name)
			if err != nil {
				if rerr := resume(); rerr != nil {
					dl.logger.ErrorContext(r.Context(), "dlqreplay: rebuild failed and a consumer could not be resumed", "consumer", c.Service, "error", rerr.Error())
				}
				return "", err
			}
			done = append(done, g.Subscription()+": "+st.Done)
			if st.Changed {
				paused = append(paused, g)
			}
		}
		if flagged {
			// A flag reaches consume within its refresh, and a delivery
			// already past the check finishes: wait both out before the
			// state is cleared.
			select {
			case <-time.After(dl.pauseSettle):
			case <-r.Context().Done():
				if rerr := resume(); rerr != nil {
					dl.logger.ErrorContext(r.Context(), "dlqreplay: rebuild failed and a consumer could not be resumed", "consumer", c.Service, "error", rerr.Error())
				}
				return "", r.Context().Err()
			}
		}
		if b.History {
			return dl.rebuildFromHistory(r, c, b.AggregateType, run, dl.dbs.mustOf(outboxName), specs, plan, resume, func() bool { return len(paused) == len(subs) }, &done)
		}
		// Seek before clearing: a paused subscription delivers nothing, so the
		// order is the same to the consumer, and a seek Pub/Sub refuses (the
		// local stack's pstest refuses any seek back) leaves the state as it
		// was.
		var seeked []string
		for _, sub := range subs {
			var err error
			if b.Snapshot != "" {
				err = snaps.SeekSnapshot(r.Context(), dl.subs.Real(sub), b.Snapshot)
			} else {
				err = seeker.SeekTime(r.Context(), dl.subs.Real(sub), at)
			}
			if err != nil {
				dl.logger.ErrorContext(r.Context(), "dlqreplay: rebuild stopped: a seek failed; nothing was cleared",
					"consumer", c.Service, "subscription", sub, "seeked", strings.Join(seeked, ","), "error", err.Error(), "request_id", r.id)
				if rerr := resume(); rerr != nil {
					dl.logger.ErrorContext(r.Context(), "dlqreplay: rebuild failed and a consumer could not be resumed", "consumer", c.Service, "error", rerr.Error())
				}
				note := "; nothing was cleared"
				if len(seeked) > 0 {
					note += fmt.Sprintf(" (%s was seeked: what it delivers again is answered as duplicates)", strings.Join(seeked, ", "))
				}
				var ae *apiError
				if errors.As(brokerErr(err, "subscription "+sub), &ae) {
					ae.Msg += note
					return "", ae
				}
				return "", fmt.Errorf("rebuild of %s: seek of %s failed%s: %w", c.Service, sub, note, err)
			}
			seeked = append(seeked, sub)
		}
		n, err := clearRebuild(r.Context(), run, c, b.AggregateType, true)
		if err != nil {
			// The subscriptions were seeked and the state kept: what they
			// deliver again is answered as duplicates.
			if rerr := resume(); rerr != nil {
				dl.logger.ErrorContext(r.Context(), "dlqreplay: rebuild failed and a consumer could not be resumed", "consumer", c.Service, "error", rerr.Error())
			}
			return "", err
		}
		if err := resume(); err != nil {
			return "", err
		}
		plan["cleared"], plan["resumed"], plan["done"] = n, len(paused) == len(subs), done
		return fmt.Sprintf("scope %s, cleared %s, %s seeked to %s%s", scopeOf(b.AggregateType), n, strings.Join(subs, ", "), b.Time, b.Snapshot), nil
	})
	if err != nil {
		return nil, err
	}
	return plan, nil
}

// rebuildFromHistory is a rebuild's steps after the pause when it replays
// from the event history: start the backfills (nothing is queued until a
// caller drives them), clear the state, resume. resume resumes what the
// rebuild paused (its steps appended to done); allResumed says whether it
// had paused every subscription of the group.
func (dl *deliveryControl) rebuildFromHistory(r *request, c topology.Consumer, aggType string, run txRunner, outboxDB postgres.DBTX,
	specs []history.Spec, plan map[string]any, resume func() error, allResumed func() bool, done *[]string) (string, error) {
	ctx := r.Context()
	stop := func(err error, ids []string) (string, error) {
		for _, id := range ids {
			if _, cerr := history.Set(context.WithoutCancel(ctx), outboxDB, id, "cancel"); cerr != nil {
				dl.logger.ErrorContext(ctx, "dlqreplay: rebuild failed and its backfill could not be cancelled", "consumer", c.Service, "backfill", id, "error", cerr.Error())
			}
		}
		if rerr := resume(); rerr != nil {
			dl.logger.ErrorContext(ctx, "dlqreplay: rebuild failed and a consumer could not be resumed", "consumer", c.Service, "error", rerr.Error())
		}
		return "", err
	}
	var (
		ids     []string
		started []history.Backfill
		matched int64
	)
	// The watermark is taken now, once the consumers are paused (and a
	// pause by flag has settled): every event they applied before the
	// pause occurred before it, so the clear below removes nothing the
	// backfills do not deliver again; what occurs after it waits for the
	// resume, and an event both ways is absorbed by the inbox.
	until := time.Now().UTC()
	for _, s := range specs {
		s.Until = until
		id := history.NewID(time.Now())
		bf, err := history.Start(ctx, outboxDB, id, s)
		if err != nil {
			return stop(fmt.Errorf("rebuild of %s: the backfill of %s did not start; nothing was cleared: %w", c.Service, s.Topic, err), ids)
		}
		ids, started, matched = append(ids, id), append(started, bf), matched+bf.Matched
	}
	n, err := clearRebuild(ctx, run, c, aggType, true)
	if err != nil {
		return stop(err, ids)
	}
	if err := resume(); err != nil {
		// The state is cleared and the backfills started: they must still
		// be driven, so the answer names them.
		dl.logger.ErrorContext(ctx, "dlqreplay: rebuild cleared the state but a consumer could not be resumed", "consumer", c.Service,
			"backfills", strings.Join(ids, ","), "error", err.Error(), "request_id", r.id)
		why := "see the service's log (request " + r.id + ")"
		var ae *apiError
		if errors.As(err, &ae) {
			why = ae.Msg
		}
		return "", fail(http.StatusInternalServerError, "not_resumed", "rebuild of %s: the state was cleared and backfills %s started, but a consumer could not be resumed: %s. Resume it (relaybus consumers resume), then drive the backfills (relaybus backfill run ID, or POST /backfills/{id}:run)",
			c.Service, strings.Join(ids, ", "), why)
	}
	plan["cleared"], plan["resumed"], plan["done"], plan["backfills"] = n, allResumed(), *done, started
	return fmt.Sprintf("scope %s, cleared %s, backfills %s started from the history since %s: %d events", scopeOf(aggType), n,
		strings.Join(ids, ", "), started[0].Since.Format(time.RFC3339), matched), nil
}

// stateSharers returns the declared consumers whose state is c's: the
// same service in the same database (c first).
func (dl *deliveryControl) stateSharers(c topology.Consumer) []topology.Consumer {
	out := []topology.Consumer{c}
	for _, g := range dl.topology.Consumers() {
		if g.Service == c.Service && g.Database == c.Database && g.Subscription() != c.Subscription() {
			out = append(out, g)
		}
	}
	return out
}

// sharedNote says why a sibling subscription's consumer blocks a rebuild.
func sharedNote(g, c topology.Consumer) string {
	if g.Subscription() == c.Subscription() {
		return ""
	}
	return fmt.Sprintf(" (it shares %s's state in database %s: a rebuild would clear it too)", c.Service, c.Database)
}

func scopeOf(aggType string) string {
	if aggType == "" {
		return "all"
	}
	return "aggregate type " + aggType
}

// topicRetention is the topic's message retention in seconds (the
// consumer subscriptions' too).
// historyReaches refuses a rebuild from the history to a time the history
// of one of group's topics may no longer hold: what it cleared it could
// not replay. The history keeps a topic's events for its
// history_retention_days from when the outbox's retention moves them
// there, so that far back (less retentionMargin) is always held; a topic
// that keeps no history holds only the outbox's last OUTBOX_RETENTION,
// which this API does not know, and is refused.
func (dl *deliveryControl) historyReaches(group []topology.Consumer, at time.Time, asked string) error {
	for _, g := range group {
		t := dl.topology.Topic(g.Topic)
		if t == nil {
			continue
		}
		keep := t.HistoryRetention()
		if keep == 0 {
			return fail(http.StatusConflict, "retention", "topic %s keeps no history (history_retention_days: 0): a rebuild from the history could clear what it cannot replay; rebuild by seek instead (without history)", g.Topic)
		}
		if earliest := time.Now().Add(-keep + retentionMargin); at.Before(earliest) {
			return fail(http.StatusConflict, "retention", "topic %s keeps its history for %s: a rebuild from the history reaches back to %s at the earliest, not %s", g.Topic, keep, earliest.UTC().Format(time.RFC3339), asked)
		}
	}
	return nil
}

func (dl *deliveryControl) topicRetention(topic string) int {
	if t := dl.topology.Topic(topic); t != nil {
		return t.MessageRetentionSeconds
	}
	return 0
}

// strictOrProjection returns the consumer's database runner.
func (dl *deliveryControl) strictOrProjection(c topology.Consumer) (topology.Consumer, txRunner, error) {
	db, err := dl.database(c)
	if err != nil {
		return c, txRunner{}, err
	}
	b, ok := db.(beginner)
	if !ok {
		return c, txRunner{}, fmt.Errorf("dlqreplay: the %s database's pool cannot begin transactions", c.Database)
	}
	return c, txRunner{db: b, consumerID: c.Service}, nil
}

// clearRebuild counts (and, when clear, deletes) the consumer's state in
// scope and its inbox rows, in one transaction, through the packages that
// own the tables.
func clearRebuild(ctx context.Context, run txRunner, c topology.Consumer, aggType string, clear bool) (rebuildCounts, error) {
	var n rebuildCounts
	err := pgx.BeginFunc(ctx, run.db, func(tx pgx.Tx) error {
		var err error
		if n.Cleared, err = projection.ClearForRebuild(ctx, tx, c.Service, aggType, !clear); err != nil {
			return err
		}
		for _, table := range c.RebuildClear {
			var k int64
			if k, err = clearTable(ctx, tx, table, !clear); err != nil {
				return err
			}
			if n.Tables == nil {
				n.Tables = map[string]int64{}
			}
			n.Tables[table] = k
		}
		n.Inbox, err = inbox.ClearForRebuild(ctx, tx, c.Service, !clear)
		return err
	})
	return n, err
}
