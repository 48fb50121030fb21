package dlqreplay

import (
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/relaybus/relaybus/internal/ledger/audit"
	"github.com/relaybus/relaybus/internal/names"
	"github.com/relaybus/relaybus/shared/broker"
	"github.com/relaybus/relaybus/shared/event"
)

type seekRequest struct {
	Time     string `json:"time"`
	Snapshot string `json:"snapshot"`
}

// subscription validates a subscription named in a request: a consumer's
// logical subscription (<topic>.<service>-<role>), a DLQ monitor
// (<topic>.dlq-monitor), or a real subscription the SubscriptionMap lists.
// It returns the real id to send Pub/Sub.
func (dl *deliveryControl) subscription(field, name string) (string, *event.FieldError) {
	bad := &event.FieldError{Field: field, Rule: names.SubscriptionRule + " (or <topic>.dlq-monitor)"}
	if len(name) > 255 || strings.Contains(name, "/") {
		return "", bad
	}
	if _, _, _, err := names.ParseSubscription(name); err == nil {
		if dl.topology != nil {
			if _, ok := dl.topology.Consumer(name); !ok {
				return "", &event.FieldError{Field: field, Rule: "a consumer subscription the topology declares (" + name + " is none)"}
			}
		}
		return dl.subs.Real(name), nil
	}
	if topic, ok := strings.CutSuffix(name, names.DeadLetterSuffix+"-monitor"); ok && names.ValidateTopic(topic) == nil {
		if dl.topology != nil && dl.topology.Topic(topic) == nil {
			return "", &event.FieldError{Field: field, Rule: "the DLQ monitor of a topic the topology declares (" + topic + " is none)"}
		}
		return name, nil
	}
	if logical := dl.subs.Logical(name); logical != name {
		return name, nil
	}
	return "", bad
}

// subscriptionTarget is what a subscription (as dl.subscription accepts
// it) belongs to: its consumer on its topic, or a DLQ monitor's topic.
func (dl *deliveryControl) subscriptionTarget(name string) target {
	logical := dl.subs.Logical(name)
	if topic, consumer, _, err := names.ParseSubscription(logical); err == nil {
		return target{Topic: topic, Consumer: consumer}
	}
	if topic, ok := strings.CutSuffix(logical, names.DeadLetterSuffix+"-monitor"); ok {
		return target{Topic: topic}
	}
	return target{Topic: logical}
}

func (dl *deliveryControl) seek(r *request, args []string) (any, error) {
	if err := newQuery(r.Request).err(); err != nil {
		return nil, err
	}
	var bad []*event.FieldError
	real, fe := dl.subscription("subscription", args[0])
	if fe != nil {
		bad = append(bad, fe)
	}
	var req seekRequest
	if err := decodeBody(r.Request, &req, false); err != nil {
		return nil, err
	}
	var at time.Time
	switch {
	case req.Time != "" && req.Snapshot == "":
		t, err := time.Parse(time.RFC3339, req.Time)
		if err != nil || t.Before(minTime) || !t.Before(maxTime) {
			bad = append(bad, &event.FieldError{Field: "time", Rule: ruleTime})
		}
		at = t
	case req.Snapshot != "" && req.Time == "":
		if !validSnapshot(req.Snapshot) {
			bad = append(bad, &event.FieldError{Field: "snapshot", Rule: ruleSnapshot})
		}
	default:
		bad = append(bad, &event.FieldError{Field: "time", Rule: `give exactly one of "time" or "snapshot"`})
	}
	if len(bad) > 0 {
		return nil, badRequest(bad)
	}
	t := dl.subscriptionTarget(args[0])
	if err := dl.g.authorize(r, audit.Seek, RoleOperator, t); err != nil {
		return nil, err
	}
	entry := audit.Entry{Action: audit.Seek, Subscription: args[0], Topic: t.Topic, ConsumerID: t.Consumer, Detail: "seek " + real + " to " + req.Time + req.Snapshot}
	// The broker's capabilities (shared/broker): a TimeSeeker seeks to a
	// time, a Snapshotter to a snapshot.
	seeker, canSeek := broker.As[broker.TimeSeeker](dl.broker)
	snaps, canSnap := broker.As[broker.Snapshotter](dl.broker)
	switch {
	case req.Snapshot != "" && !canSnap && canSeek:
		return nil, fail(http.StatusNotImplemented, "unavailable", "snapshots are Pub/Sub's; on this transport seek to a time")
	case req.Snapshot != "" && !canSnap, req.Time != "" && !canSeek:
		return nil, fail(http.StatusNotImplemented, "unavailable", "seek is not configured")
	}
	err := dl.g.run(r, entry, func(*step) (string, error) {
		var err error
		if req.Snapshot != "" {
			err = snaps.SeekSnapshot(r.Context(), real, req.Snapshot)
		} else {
			err = seeker.SeekTime(r.Context(), real, at)
		}
		if err != nil {
			return "", brokerErr(err, "subscription "+args[0])
		}
		return "seeked " + real + " to " + req.Time + req.Snapshot, nil
	})
	if err != nil {
		return nil, err
	}
	if !canSnap {
		return map[string]string{"subscription": args[0], "time": req.Time}, nil
	}
	return map[string]string{"subscription": args[0], "pubsubSubscription": real, "time": req.Time, "snapshot": req.Snapshot}, nil
}

// brokerErr answers the broker's refusals that are the caller's (an
// unknown subscription or snapshot, an existing snapshot: a
// *broker.Error) in the API's words; a refused seek also carries the
// broker's reason, which says what to change (the local stack's Pub/Sub
// names the time it would accept).
func brokerErr(err error, what string) error {
	var be *broker.Error
	if !errors.As(err, &be) {
		return err
	}
	switch {
	case errors.Is(err, broker.ErrNotFound):
		return fail(http.StatusNotFound, "not_found", "the broker has no %s (or no snapshot of that name)", what)
	case errors.Is(err, broker.ErrExists):
		return fail(http.StatusConflict, "exists", "a snapshot of that name exists")
	case errors.Is(err, broker.ErrRefused):
		return fail(http.StatusConflict, "refused", "the broker refused it for %s: %s (a time its retention cannot reach, or a snapshot of another topic)",
			what, be.Reason)
	case errors.Is(err, broker.ErrPermissionDenied):
		return fail(http.StatusForbidden, "permission_denied", "dlqreplay's service account may not do that on %s", what)
	}
	return err
}

type snapshotRequest struct {
	Name         string `json:"name"`
	Subscription string `json:"subscription"`
}

func (dl *deliveryControl) createSnapshot(r *request, _ []string) (any, error) {
	if err := newQuery(r.Request).err(); err != nil {
		return nil, err
	}
	var req snapshotRequest
	if err := decodeBody(r.Request, &req, false); err != nil {
		return nil, err
	}
	var bad []*event.FieldError
	if !validSnapshot(req.Name) {
		bad = append(bad, &event.FieldError{Field: "name", Rule: ruleSnapshot})
	}
	real, fe := dl.subscription("subscription", req.Subscription)
	if fe != nil {
		bad = append(bad, fe)
	}
	if len(bad) > 0 {
		return nil, badRequest(bad)
	}
	snaps, ok := broker.As[broker.Snapshotter](dl.broker)
	if !ok {
		return nil, fail(http.StatusNotImplemented, "unavailable", "snapshots are not configured")
	}
	t := dl.subscriptionTarget(req.Subscription)
	if err := dl.g.authorize(r, audit.Snapshot, RoleOperator, t); err != nil {
		return nil, err
	}
	var snap broker.Snapshot
	err := dl.g.run(r, audit.Entry{Action: audit.Snapshot, Subscription: req.Subscription, Topic: t.Topic, ConsumerID: t.Consumer,
		Detail: "snapshot " + req.Name + " of " + real}, func(*step) (string, error) {
		var err error
		if snap, err = snaps.CreateSnapshot(r.Context(), req.Name, real); err != nil {
			return "", brokerErr(err, "subscription "+req.Subscription)
		}
		return "snapshot " + req.Name + " of " + real, nil
	})
	if err != nil {
		return nil, err
	}
	return snapshotView(snap), nil
}

func (dl *deliveryControl) listSnapshots(r *request, _ []string) (any, error) {
	if err := newQuery(r.Request).err(); err != nil {
		return nil, err
	}
	snaps, ok := broker.As[broker.Snapshotter](dl.broker)
	if !ok {
		return nil, fail(http.StatusNotImplemented, "unavailable", "snapshots are not configured")
	}
	list, err := snaps.Snapshots(r.Context())
	if err != nil {
		return nil, brokerErr(err, "the project's snapshots")
	}
	out := []map[string]string{}
	for _, s := range list {
		out = append(out, snapshotView(s))
	}
	return map[string]any{"snapshots": out}, nil
}

func snapshotView(s broker.Snapshot) map[string]string {
	v := map[string]string{"name": s.Name, "topic": s.Topic}
	if !s.Expires.IsZero() {
		v["expireTime"] = s.Expires.Format(time.RFC3339)
	}
	return v
}
