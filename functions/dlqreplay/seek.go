package dlqreplay

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	vkit "cloud.google.com/go/pubsub/v2/apiv1"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/api/iterator"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/relaybus/relaybus/internal/instance/brokeropen"
	"github.com/relaybus/relaybus/internal/ledger/audit"
	"github.com/relaybus/relaybus/internal/names"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/transport"
)

// Seeker rewinds subscriptions and keeps snapshots (Pub/Sub's subscription
// admin client), for rebuilding a projection: take a snapshot (or pick a
// time), drop the projection, seek, and the subscription delivers again
// everything it retained since.
type Seeker struct {
	Admin   *vkit.SubscriptionAdminClient
	Project string
}

// TimeSeeker rewinds a subscription to a time on a transport without
// Pub/Sub's admin API: every message stored at or after t is delivered
// again. *natsjs.Client implements it (by recreating the durable consumer
// with DeliverByStartTime: see its SeekTime).
type TimeSeeker interface {
	SeekTime(ctx context.Context, subscription string, t time.Time) error
}

// seekersOf returns the Seeker of a Pub/Sub broker, or the TimeSeeker of
// another (NATS: seek to a time only; snapshots, rebuild and the
// PushPauser are Pub/Sub's admin API and answer 501 "not configured").
func seekersOf(b brokeropen.Broker, project string) (*Seeker, TimeSeeker) {
	if c, ok := b.(*transport.Client); ok {
		return &Seeker{Admin: c.PubSub().SubscriptionAdminClient, Project: project}, nil
	}
	if ts, ok := b.(TimeSeeker); ok {
		return nil, ts
	}
	return nil, nil
}

type seekRequest struct {
	Time     string `json:"time"`
	Snapshot string `json:"snapshot"`
}

// subscription validates a subscription named in a request: a consumer's
// logical subscription (<topic>.<service>-<role>), a DLQ monitor
// (<topic>.dlq-monitor), or a real subscription the SubscriptionMap lists.
// It returns the real id to send Pub/Sub.
func (a *api) subscription(field, name string) (string, *event.FieldError) {
	bad := &event.FieldError{Field: field, Rule: names.SubscriptionRule + " (or <topic>.dlq-monitor)"}
	if len(name) > 255 || strings.Contains(name, "/") {
		return "", bad
	}
	if _, _, _, err := names.ParseSubscription(name); err == nil {
		if a.o.Topology != nil {
			if _, ok := a.o.Topology.Consumer(name); !ok {
				return "", &event.FieldError{Field: field, Rule: "a consumer subscription the topology declares (" + name + " is none)"}
			}
		}
		return a.o.Subscriptions.Real(name), nil
	}
	if topic, ok := strings.CutSuffix(name, names.DeadLetterSuffix+"-monitor"); ok && names.ValidateTopic(topic) == nil {
		if a.o.Topology != nil && a.o.Topology.Topic(topic) == nil {
			return "", &event.FieldError{Field: field, Rule: "the DLQ monitor of a topic the topology declares (" + topic + " is none)"}
		}
		return name, nil
	}
	if logical := a.o.Subscriptions.Logical(name); logical != name {
		return name, nil
	}
	return "", bad
}

// subscriptionTarget is what a subscription (as a.subscription accepts
// it) belongs to: its consumer on its topic, or a DLQ monitor's topic.
func (a *api) subscriptionTarget(name string) target {
	logical := a.o.Subscriptions.Logical(name)
	if topic, consumer, _, err := names.ParseSubscription(logical); err == nil {
		return target{Topic: topic, Consumer: consumer}
	}
	if topic, ok := strings.CutSuffix(logical, names.DeadLetterSuffix+"-monitor"); ok {
		return target{Topic: topic}
	}
	return target{Topic: logical}
}

func (a *api) seek(r *request, args []string) (any, error) {
	if err := newQuery(r.Request).err(); err != nil {
		return nil, err
	}
	var bad []*event.FieldError
	real, fe := a.subscription("subscription", args[0])
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
	t := a.subscriptionTarget(args[0])
	if err := a.authorize(r, audit.Seek, RoleOperator, t); err != nil {
		return nil, err
	}
	entry := audit.Entry{Action: audit.Seek, Subscription: args[0], Topic: t.Topic, ConsumerID: t.Consumer, Detail: "seek " + real + " to " + req.Time + req.Snapshot}
	if a.o.Seeker == nil && a.o.TimeSeeker != nil && req.Time != "" {
		err := a.run(r, entry, func(*step) (string, error) {
			return "seeked " + real + " to " + req.Time, a.o.TimeSeeker.SeekTime(r.Context(), real, at)
		})
		if err != nil {
			return nil, err
		}
		return map[string]string{"subscription": args[0], "time": req.Time}, nil
	}
	if a.o.Seeker == nil {
		if a.o.TimeSeeker != nil {
			return nil, fail(http.StatusNotImplemented, "unavailable", "snapshots are Pub/Sub's; on this transport seek to a time")
		}
		return nil, fail(http.StatusNotImplemented, "unavailable", "seek is not configured")
	}
	s := a.o.Seeker
	sr := &pb.SeekRequest{Subscription: "projects/" + s.Project + "/subscriptions/" + real}
	if req.Snapshot != "" {
		sr.Target = &pb.SeekRequest_Snapshot{Snapshot: "projects/" + s.Project + "/snapshots/" + req.Snapshot}
	} else {
		sr.Target = &pb.SeekRequest_Time{Time: timestamppb.New(at)}
	}
	err := a.run(r, entry, func(*step) (string, error) {
		if _, err := s.Admin.Seek(r.Context(), sr); err != nil {
			return "", pubsubErr(err, "subscription "+args[0])
		}
		return "seeked " + real + " to " + req.Time + req.Snapshot, nil
	})
	if err != nil {
		return nil, err
	}
	return map[string]string{"subscription": args[0], "pubsubSubscription": real, "time": req.Time, "snapshot": req.Snapshot}, nil
}

// pubsubErr answers Pub/Sub's refusals that are the caller's (an unknown
// subscription or snapshot, an existing snapshot) in the API's words; a
// refused seek also carries Pub/Sub's reason, which says what to change
// (the local stack's Pub/Sub names the time it would accept).
func pubsubErr(err error, what string) error {
	switch status.Code(err) {
	case codes.NotFound:
		return fail(http.StatusNotFound, "not_found", "Pub/Sub has no %s (or no snapshot of that name)", what)
	case codes.AlreadyExists:
		return fail(http.StatusConflict, "exists", "a snapshot of that name exists")
	case codes.FailedPrecondition, codes.InvalidArgument:
		return fail(http.StatusConflict, "refused", "Pub/Sub refused it for %s: %s (Pub/Sub refuses a time its retention cannot reach and a snapshot of another topic)",
			what, status.Convert(err).Message())
	case codes.PermissionDenied:
		return fail(http.StatusForbidden, "permission_denied", "dlqreplay's service account may not do that on %s", what)
	}
	return err
}

type snapshotRequest struct {
	Name         string `json:"name"`
	Subscription string `json:"subscription"`
}

func (a *api) createSnapshot(r *request, _ []string) (any, error) {
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
	real, fe := a.subscription("subscription", req.Subscription)
	if fe != nil {
		bad = append(bad, fe)
	}
	if len(bad) > 0 {
		return nil, badRequest(bad)
	}
	if a.o.Seeker == nil {
		return nil, fail(http.StatusNotImplemented, "unavailable", "snapshots are not configured")
	}
	t := a.subscriptionTarget(req.Subscription)
	if err := a.authorize(r, audit.Snapshot, RoleOperator, t); err != nil {
		return nil, err
	}
	s := a.o.Seeker
	var snap *pb.Snapshot
	err := a.run(r, audit.Entry{Action: audit.Snapshot, Subscription: req.Subscription, Topic: t.Topic, ConsumerID: t.Consumer,
		Detail: "snapshot " + req.Name + " of " + real}, func(*step) (string, error) {
		var err error
		snap, err = s.Admin.CreateSnapshot(r.Context(), &pb.CreateSnapshotRequest{
			Name:         "projects/" + s.Project + "/snapshots/" + req.Name,
			Subscription: "projects/" + s.Project + "/subscriptions/" + real,
		})
		if err != nil {
			return "", pubsubErr(err, "subscription "+req.Subscription)
		}
		return "snapshot " + req.Name + " of " + real, nil
	})
	if err != nil {
		return nil, err
	}
	return snapshotView(snap), nil
}

func (a *api) listSnapshots(r *request, _ []string) (any, error) {
	if err := newQuery(r.Request).err(); err != nil {
		return nil, err
	}
	if a.o.Seeker == nil {
		return nil, fail(http.StatusNotImplemented, "unavailable", "snapshots are not configured")
	}
	return a.snapshots(r.Context())
}

func (a *api) snapshots(ctx context.Context) (any, error) {
	it := a.o.Seeker.Admin.ListSnapshots(ctx, &pb.ListSnapshotsRequest{Project: "projects/" + a.o.Seeker.Project})
	out := []map[string]string{}
	for {
		s, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return map[string]any{"snapshots": out}, nil
		}
		if err != nil {
			return nil, err
		}
		out = append(out, snapshotView(s))
	}
}

func snapshotView(s *pb.Snapshot) map[string]string {
	v := map[string]string{"name": names.ResourceID(s.GetName()), "topic": names.ResourceID(s.GetTopic())}
	if s.GetExpireTime() != nil {
		v["expireTime"] = s.GetExpireTime().AsTime().Format(time.RFC3339)
	}
	return v
}
