package pubsub

import (
	"context"
	"errors"
	"fmt"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/api/iterator"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/relaybus/relaybus/internal/names"
	"github.com/relaybus/relaybus/shared/broker"
)

// The capabilities (shared/broker) Pub/Sub's subscription admin API
// gives: seek to a time or a snapshot
// (https://cloud.google.com/pubsub/docs/replay-overview), snapshots, and
// the push configuration dlqreplay pauses a push consumer with.

func (c *Client) subPath(id string) string {
	return "projects/" + c.ps.Project() + "/subscriptions/" + id
}

func (c *Client) snapshotPath(id string) string {
	return "projects/" + c.ps.Project() + "/snapshots/" + id
}

// SeekTime rewinds subscription to t (broker.TimeSeeker): every message
// retained from t on is delivered again, acknowledged or not.
func (c *Client) SeekTime(ctx context.Context, subscription string, t time.Time) error {
	_, err := c.ps.SubscriptionAdminClient.Seek(ctx, &pb.SeekRequest{Subscription: c.subPath(subscription),
		Target: &pb.SeekRequest_Time{Time: timestamppb.New(t)}})
	return adminErr(err, "seek "+subscription)
}

// SeekSnapshot rewinds subscription to the snapshot named snapshot
// (broker.Snapshotter).
func (c *Client) SeekSnapshot(ctx context.Context, subscription, snapshot string) error {
	_, err := c.ps.SubscriptionAdminClient.Seek(ctx, &pb.SeekRequest{Subscription: c.subPath(subscription),
		Target: &pb.SeekRequest_Snapshot{Snapshot: c.snapshotPath(snapshot)}})
	return adminErr(err, "seek "+subscription)
}

// CreateSnapshot takes a snapshot named name of subscription
// (broker.Snapshotter).
func (c *Client) CreateSnapshot(ctx context.Context, name, subscription string) (broker.Snapshot, error) {
	s, err := c.ps.SubscriptionAdminClient.CreateSnapshot(ctx, &pb.CreateSnapshotRequest{
		Name: c.snapshotPath(name), Subscription: c.subPath(subscription)})
	if err != nil {
		return broker.Snapshot{}, adminErr(err, "snapshot "+name+" of "+subscription)
	}
	return snapshot(s), nil
}

// Snapshots lists the project's snapshots (broker.Snapshotter).
func (c *Client) Snapshots(ctx context.Context) ([]broker.Snapshot, error) {
	it := c.ps.SubscriptionAdminClient.ListSnapshots(ctx, &pb.ListSnapshotsRequest{Project: "projects/" + c.ps.Project()})
	out := []broker.Snapshot{}
	for {
		s, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return out, nil
		}
		if err != nil {
			return nil, adminErr(err, "list snapshots")
		}
		out = append(out, snapshot(s))
	}
}

func snapshot(s *pb.Snapshot) broker.Snapshot {
	out := broker.Snapshot{Name: names.ResourceID(s.GetName()), Topic: names.ResourceID(s.GetTopic())}
	if s.GetExpireTime() != nil {
		out.Expires = s.GetExpireTime().AsTime()
	}
	return out
}

// PushEndpoint returns where subscription pushes (broker.PushConfigurer;
// empty: nowhere, a pull subscription or a paused push one).
func (c *Client) PushEndpoint(ctx context.Context, subscription string) (broker.PushEndpoint, error) {
	s, err := c.ps.SubscriptionAdminClient.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: c.subPath(subscription)})
	if err != nil {
		return broker.PushEndpoint{}, adminErr(err, "subscription "+subscription)
	}
	pc := s.GetPushConfig()
	return broker.PushEndpoint{URL: pc.GetPushEndpoint(), ServiceAccount: pc.GetOidcToken().GetServiceAccountEmail(),
		Audience: pc.GetOidcToken().GetAudience()}, nil
}

// SetPushEndpoint sets where subscription pushes (broker.PushConfigurer)
// unless it already pushes there with that identity. An empty endpoint
// detaches it: "An empty pushConfig indicates that the Pub/Sub system
// should stop pushing messages from the given subscription"
// (https://cloud.google.com/pubsub/docs/reference/rest/v1/projects.subscriptions/modifyPushConfig),
// and messages accumulate, in order, until it is set back.
func (c *Client) SetPushEndpoint(ctx context.Context, subscription string, e broker.PushEndpoint) (bool, error) {
	cur, err := c.PushEndpoint(ctx, subscription)
	if err != nil {
		return false, err
	}
	if cur.URL == e.URL && (e.URL == "" || cur.ServiceAccount == e.ServiceAccount) {
		return false, nil
	}
	want := &pb.PushConfig{}
	if e.URL != "" {
		want = &pb.PushConfig{PushEndpoint: e.URL, AuthenticationMethod: &pb.PushConfig_OidcToken_{
			OidcToken: &pb.PushConfig_OidcToken{ServiceAccountEmail: e.ServiceAccount, Audience: e.Audience}}}
	}
	if _, err := c.ps.SubscriptionAdminClient.UpdateSubscription(ctx, &pb.UpdateSubscriptionRequest{
		Subscription: &pb.Subscription{Name: c.subPath(subscription), PushConfig: want},
		UpdateMask:   &fieldmaskpb.FieldMask{Paths: []string{"push_config"}},
	}); err != nil {
		return false, adminErr(err, "subscription "+subscription)
	}
	return true, nil
}

// adminErr makes the refusals a caller answers a *broker.Error (Kind
// broker.ErrNotFound, ErrExists, ErrRefused or ErrPermissionDenied, with
// Pub/Sub's reason, which says what to change); other errors are wrapped.
func adminErr(err error, what string) error {
	if err == nil {
		return nil
	}
	var kind error
	switch status.Code(err) {
	case codes.NotFound:
		kind = broker.ErrNotFound
	case codes.AlreadyExists:
		kind = broker.ErrExists
	case codes.FailedPrecondition, codes.InvalidArgument:
		kind = broker.ErrRefused
	case codes.PermissionDenied:
		kind = broker.ErrPermissionDenied
	default:
		return fmt.Errorf("pubsub: %s: %w", what, err)
	}
	return &broker.Error{Kind: kind, Reason: status.Convert(err).Message(), Err: err}
}
