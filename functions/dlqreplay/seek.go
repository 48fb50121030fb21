package dlqreplay

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"

	vkit "cloud.google.com/go/pubsub/v2/apiv1"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/api/iterator"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/relaybus/relaybus/shared/names"
)

// Seeker rewinds subscriptions and keeps snapshots (Pub/Sub's subscription
// admin client), for rebuilding a projection: take a snapshot (or pick a
// time), drop the projection, seek, and the subscription delivers again
// everything it retained since.
type Seeker struct {
	Admin   *vkit.SubscriptionAdminClient
	Project string
}

type seekRequest struct {
	Time     string `json:"time"`
	Snapshot string `json:"snapshot"`
}

func (a *api) seek(r *http.Request, sub, who string) (any, error) {
	if a.o.Seeker == nil {
		return nil, fail(http.StatusNotImplemented, "unavailable", "seek is not configured")
	}
	if _, _, _, err := names.ParseSubscription(sub); err != nil && !strings.HasSuffix(sub, "-monitor") {
		return nil, fail(http.StatusBadRequest, "invalid_argument", "subscription: %v", err)
	}
	var req seekRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		return nil, fail(http.StatusBadRequest, "invalid_argument", "body: %v", err)
	}
	s := a.o.Seeker
	sr := &pb.SeekRequest{Subscription: "projects/" + s.Project + "/subscriptions/" + sub}
	switch {
	case req.Time != "" && req.Snapshot == "":
		t, err := time.Parse(time.RFC3339, req.Time)
		if err != nil {
			return nil, fail(http.StatusBadRequest, "invalid_argument", "time: an RFC 3339 time, got %q", req.Time)
		}
		sr.Target = &pb.SeekRequest_Time{Time: timestamppb.New(t)}
	case req.Snapshot != "" && req.Time == "":
		sr.Target = &pb.SeekRequest_Snapshot{Snapshot: "projects/" + s.Project + "/snapshots/" + req.Snapshot}
	default:
		return nil, fail(http.StatusBadRequest, "invalid_argument", `give exactly one of "time" or "snapshot"`)
	}
	if _, err := s.Admin.Seek(r.Context(), sr); err != nil {
		return nil, err
	}
	a.o.Logger.InfoContext(r.Context(), "dlqreplay: subscription seeked", "subscription", sub, "time", req.Time, "snapshot", req.Snapshot, "caller", who)
	return map[string]string{"subscription": sub, "time": req.Time, "snapshot": req.Snapshot}, nil
}

type snapshotRequest struct {
	Name         string `json:"name"`
	Subscription string `json:"subscription"`
}

func (a *api) createSnapshot(r *http.Request, who string) (any, error) {
	if a.o.Seeker == nil {
		return nil, fail(http.StatusNotImplemented, "unavailable", "snapshots are not configured")
	}
	var req snapshotRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Name == "" || req.Subscription == "" {
		return nil, fail(http.StatusBadRequest, "invalid_argument", `body: {"name", "subscription"} are required`)
	}
	s := a.o.Seeker
	snap, err := s.Admin.CreateSnapshot(r.Context(), &pb.CreateSnapshotRequest{
		Name:         "projects/" + s.Project + "/snapshots/" + req.Name,
		Subscription: "projects/" + s.Project + "/subscriptions/" + req.Subscription,
	})
	if err != nil {
		return nil, err
	}
	a.o.Logger.InfoContext(r.Context(), "dlqreplay: snapshot created", "snapshot", req.Name, "subscription", req.Subscription, "caller", who)
	return snapshotView(snap), nil
}

func (a *api) listSnapshots(ctx context.Context) (any, error) {
	if a.o.Seeker == nil {
		return nil, fail(http.StatusNotImplemented, "unavailable", "snapshots are not configured")
	}
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
	short := func(p string) string { return p[strings.LastIndex(p, "/")+1:] }
	v := map[string]string{"name": short(s.GetName()), "topic": short(s.GetTopic())}
	if s.GetExpireTime() != nil {
		v["expireTime"] = s.GetExpireTime().AsTime().Format(time.RFC3339)
	}
	return v
}
