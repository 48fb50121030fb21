package dlqreplay

import (
	"context"
	"fmt"
	"net/http"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/relaybus/relaybus/shared/ledger"
	"github.com/relaybus/relaybus/shared/topology"
)

// Rebuilding a consumer's projection (outbox-streamingpull.md §8, backfill
// and rebuild by Seek), in one call:
//
//  1. pause the consumer (pause.go), so nothing is applied while its state
//     is cleared;
//  2. in its own database, in one transaction: delete its projection state
//     for the scope (relaybus_projection, and a strict consumer's position,
//     parked and skipped rows; all aggregate types, or one) and its inbox
//     rows, so the redeliveries are applied instead of answered as
//     duplicates. The inbox has no aggregate type, so all of the
//     consumer's inbox rows go: a redelivered event of another aggregate
//     type meets that aggregate's kept state, and the built-in handlers'
//     version gate makes it a no-op;
//  3. seek its subscription to the time or snapshot (consumer subscriptions
//     retain acknowledged messages for their retention period);
//  4. resume it (unless it was paused before), and Pub/Sub delivers again
//     everything since that point, in order.
//
// Only the built-in handlers (projection, strict) keep their state where
// relaybus knows it; another handler's tables are its own and the rebuild
// is refused. Eventarc consumers cannot be paused and are refused. A time
// older than the subscription's retention allows is refused before
// anything changes. The dry run says what would be cleared and replayed.

// retentionMargin keeps a seek clear of the retention's edge: the call
// takes a moment, and a time that falls out of the window meanwhile would
// skip messages silently.
const retentionMargin = 5 * time.Minute

type rebuildBody struct {
	Time          string `json:"time"`
	Snapshot      string `json:"snapshot"`
	AggregateType string `json:"aggregateType"`
	DryRun        bool   `json:"dryRun"`
}

type rebuildCounts struct {
	Projection int64 `json:"projectionRows"`
	Positions  int64 `json:"strictPositions"`
	Parked     int64 `json:"strictParked"`
	Skipped    int64 `json:"strictSkipped"`
	Inbox      int64 `json:"inboxRows"`
}

func (a *api) rebuild(r *request, args []string) (any, error) {
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
	if err := bad.err(); err != nil {
		return nil, err
	}
	if !b.DryRun {
		if err := a.canWrite(r.who); err != nil {
			return nil, err
		}
	}
	c, err := a.declared(topic, id)
	if err != nil {
		return nil, err
	}
	if c.Handler != topology.HandlerProjection && c.Handler != topology.HandlerStrict {
		return nil, fail(http.StatusConflict, "handler", "%s on %s runs handler %q, which keeps its state in its own tables: clear them yourself, then pause, seek and resume (only the projection and strict handlers' state is relaybus's)", id, topic, c.Handler)
	}
	if c.Delivery != topology.DeliveryPush {
		return nil, fail(http.StatusConflict, "eventarc", "%s on %s is delivered by an Eventarc trigger, which cannot be paused: a rebuild needs delivery: push", id, topic)
	}
	retention := time.Duration(a.topicRetention(c.Topic)) * time.Second
	if b.Time != "" {
		if earliest := time.Now().Add(-retention + retentionMargin); at.Before(earliest) {
			return nil, fail(http.StatusConflict, "retention", "%s retains messages for %s: a seek reaches back to %s at the earliest, not %s", c.Subscription(), retention, earliest.UTC().Format(time.RFC3339), b.Time)
		}
		if at.After(time.Now()) {
			return nil, fail(http.StatusConflict, "future", "time %s is in the future: nothing would be replayed", b.Time)
		}
	}
	_, run, err := a.strictOrProjection(c)
	if err != nil {
		return nil, err
	}
	plan := map[string]any{"topic": c.Topic, "consumer": c.Service, "subscription": c.Subscription(), "database": c.Database,
		"handler": c.Handler, "scope": scopeOf(b.AggregateType), "time": b.Time, "snapshot": b.Snapshot, "retention": retention.String()}
	if c.Handler == topology.HandlerStrict {
		// Its positions start again at 0: an aggregate whose first
		// versions were published before the seek point parks what is
		// replayed behind a gap (list and skip it: gaps.go).
		plan["warning"] = "a strict consumer replays every version in order from 1: aggregates whose first versions are older than the seek point will show gaps (relaybus gaps ls)"
	}
	if b.DryRun {
		n, err := a.clearRebuild(r.Context(), run, c, b.AggregateType, false)
		if err != nil {
			return nil, err
		}
		plan["dryRun"], plan["wouldClear"] = true, n
		plan["steps"] = []string{"pause " + c.Subscription(), "clear the counts above in database " + c.Database,
			"seek to " + b.Time + b.Snapshot, "resume: Pub/Sub delivers every message retained since then, in order"}
		return plan, nil
	}
	if a.o.Seeker == nil || a.o.Pauser == nil {
		return nil, fail(http.StatusNotImplemented, "unavailable", "Pub/Sub administration is not configured (seek and pause)")
	}
	if pp, ok := a.o.Pauser.(*PushPauser); ok {
		if _, ok := pp.Targets[c.Subscription()]; !ok {
			return nil, fail(http.StatusConflict, "no_push_target", "dlqreplay does not know %s's push endpoint (DLQREPLAY_PUSH_TARGETS), so it could not resume it after the rebuild", c.Subscription())
		}
	}
	sub := "projects/" + a.o.Seeker.Project + "/subscriptions/" + a.o.Subscriptions.Real(c.Subscription())
	changed, err := a.o.Pauser.Pause(r.Context(), c.Subscription())
	if err != nil {
		return nil, err
	}
	wasPaused := !changed
	resume := func() error {
		if wasPaused {
			return nil
		}
		_, err := a.o.Pauser.Resume(r.Context(), c.Subscription())
		return err
	}
	n, err := a.clearRebuild(r.Context(), run, c, b.AggregateType, true)
	if err != nil {
		if rerr := resume(); rerr != nil {
			a.o.Logger.ErrorContext(r.Context(), "dlqreplay: rebuild failed and the consumer could not be resumed", "consumer", c.Service, "error", rerr.Error())
		}
		return nil, err
	}
	seek := &pb.SeekRequest{Subscription: sub}
	if b.Snapshot != "" {
		seek.Target = &pb.SeekRequest_Snapshot{Snapshot: "projects/" + a.o.Seeker.Project + "/snapshots/" + b.Snapshot}
	} else {
		seek.Target = &pb.SeekRequest_Time{Time: timestamppb.New(at)}
	}
	if _, err := a.o.Seeker.Admin.Seek(r.Context(), seek); err != nil {
		a.o.Logger.ErrorContext(r.Context(), "dlqreplay: rebuild cleared the state but the seek failed; the consumer stays paused",
			"consumer", c.Service, "subscription", c.Subscription(), "error", err.Error(), "request_id", r.id)
		e := pubsubErr(err, "subscription "+c.Subscription())
		if ae, ok := e.(*apiError); ok {
			ae.Msg += fmt.Sprintf("; the state was cleared (%+v) and %s stays paused: seek it, then resume it", n, c.Service)
			return nil, ae
		}
		return nil, fmt.Errorf("rebuild of %s: state cleared, seek failed, consumer paused: %w", c.Service, err)
	}
	if err := resume(); err != nil {
		return nil, err
	}
	a.record(r, ledger.AuditEntry{Action: "consumer.rebuild", Topic: c.Topic, ConsumerID: c.Service, Subscription: c.Subscription(),
		Detail: fmt.Sprintf("scope %s, cleared %+v, seeked to %s%s", scopeOf(b.AggregateType), n, b.Time, b.Snapshot)},
		"dlqreplay: projection rebuilt", "topic", c.Topic, "consumer", c.Service, "scope", scopeOf(b.AggregateType), "time", b.Time, "snapshot", b.Snapshot)
	plan["cleared"], plan["resumed"] = n, !wasPaused
	return plan, nil
}

func scopeOf(aggType string) string {
	if aggType == "" {
		return "all"
	}
	return "aggregate type " + aggType
}

// topicRetention is the topic's message retention in seconds (the
// consumer subscriptions' too).
func (a *api) topicRetention(topic string) int {
	if t := a.o.Topology.Topic(topic); t != nil {
		return t.MessageRetentionSeconds
	}
	return 0
}

// strictOrProjection returns the consumer's database runner.
func (a *api) strictOrProjection(c topology.Consumer) (topology.Consumer, txRunner, error) {
	db, err := a.database(c)
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
// scope and its inbox rows, in one transaction.
func (a *api) clearRebuild(ctx context.Context, run txRunner, c topology.Consumer, aggType string, clear bool) (rebuildCounts, error) {
	var n rebuildCounts
	err := pgx.BeginFunc(ctx, run.db, func(tx pgx.Tx) error {
		tables := []struct {
			name   string
			scoped bool
			into   *int64
		}{
			{"relaybus_projection", true, &n.Projection},
			{"relaybus_strict_position", true, &n.Positions},
			{"relaybus_strict_parked", true, &n.Parked},
			{"relaybus_strict_skipped", true, &n.Skipped},
			{"relaybus_inbox", false, &n.Inbox},
		}
		for _, t := range tables {
			var exists bool
			if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, t.name).Scan(&exists); err != nil {
				return err
			}
			if !exists {
				continue // the consumer has not created it (it has not run, or is not strict)
			}
			where, qargs := "consumer_id = $1", []any{c.Service}
			if t.scoped && aggType != "" {
				where, qargs = where+" AND aggregate_type = $2", append(qargs, aggType)
			}
			// The table names are the constants above.
			q := "SELECT count(*) FROM " + t.name + " WHERE " + where
			if clear {
				q = "WITH d AS (DELETE FROM " + t.name + " WHERE " + where + " RETURNING 1) SELECT count(*) FROM d"
			}
			if err := tx.QueryRow(ctx, q, qargs...).Scan(t.into); err != nil {
				return fmt.Errorf("rebuild: %s: %w", t.name, err)
			}
		}
		return nil
	})
	return n, err
}
