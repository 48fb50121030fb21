package pstestserver

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/relaybus/relaybus/internal/eventually"
	"github.com/relaybus/relaybus/shared/broker/pubsub"
)

const (
	topic = "projects/p/topics/orders"
	sub   = "projects/p/subscriptions/orders-sub"
)

// serve starts a server with o and returns it with a client and the topic.
func serve(t *testing.T, o Options) (*Server, *pubsub.Client) {
	t.Helper()
	srv, err := Start("127.0.0.1:0", o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	c, err := pubsub.Dial(context.Background(), "p", srv.Addr, pubsub.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if _, err := c.PubSub().TopicAdminClient.CreateTopic(context.Background(), &pb.Topic{Name: topic}); err != nil {
		t.Fatal(err)
	}
	return srv, c
}

// subscribe creates the subscription with the given ack deadline.
func subscribe(t *testing.T, c *pubsub.Client, ordered bool, ackDeadline int32) {
	t.Helper()
	if _, err := c.PubSub().SubscriptionAdminClient.CreateSubscription(context.Background(), &pb.Subscription{Name: sub, Topic: topic,
		EnableMessageOrdering: ordered, AckDeadlineSeconds: ackDeadline}); err != nil {
		t.Fatal(err)
	}
}

// setup serves a default server with an ordered subscription (10 s).
func setup(t *testing.T) *pubsub.Client {
	t.Helper()
	_, c := serve(t, Options{})
	subscribe(t, c, true, 10)
	return c
}

func publish(t *testing.T, c *pubsub.Client, data, key string) {
	t.Helper()
	if _, err := c.PubSub().TopicAdminClient.Publish(context.Background(), &pb.PublishRequest{Topic: topic,
		Messages: []*pb.PubsubMessage{{Data: []byte(data), OrderingKey: key}}}); err != nil {
		t.Fatal(err)
	}
}

// A waiting Pull answers with a message published while it waits, long
// before its deadline: the loop is not held up by pstest's fixed 500 ms.
// The Pull never polls here (Poll is an hour): only the publish's wake-up
// can answer it before its deadline.
func TestPullReturnsWhenAMessageIsPublished(t *testing.T) {
	srv, c := serve(t, Options{Poll: time.Hour})
	subscribe(t, c, true, 10)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type answer struct {
		resp *pb.PullResponse
		err  error
	}
	pulled := make(chan answer, 1)
	t0 := time.Now()
	go func() {
		resp, err := c.PubSub().SubscriptionAdminClient.Pull(ctx, &pb.PullRequest{Subscription: sub, MaxMessages: 10})
		pulled <- answer{resp, err}
	}()
	// Publish once the Pull waits on the topic (it listens before it
	// looks, and found nothing).
	eventually.True(t, 5*time.Second, "the Pull waiting on the topic", func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		_, ok := srv.wakes[topic]
		return ok
	})
	publish(t, c, "late", "k")
	a := <-pulled
	if a.err != nil {
		t.Fatal(a.err)
	}
	if got := a.resp.GetReceivedMessages(); len(got) != 1 || string(got[0].GetMessage().GetData()) != "late" {
		t.Fatalf("Pull answered %v after %v, want the message published while it waited", got, time.Since(t0))
	}
	if d := time.Since(t0); d > 5*time.Second {
		t.Errorf("Pull took %v: it waited for its deadline instead of the publish", d)
	}
}

// With nothing to deliver, a waiting Pull answers empty before the
// caller's deadline (not DEADLINE_EXCEEDED), so a pull that gave up never
// took a message with it.
func TestPullAnswersEmptyBeforeTheDeadline(t *testing.T) {
	c := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	resp, err := c.PubSub().SubscriptionAdminClient.Pull(ctx, &pb.PullRequest{Subscription: sub, MaxMessages: 10})
	if err != nil {
		t.Fatalf("Pull with nothing to deliver: %v, want an empty answer", err)
	}
	if n := len(resp.GetReceivedMessages()); n != 0 {
		t.Fatalf("Pull answered %d messages on an empty subscription", n)
	}
	if ctx.Err() != nil {
		t.Errorf("Pull answered after its caller's deadline")
	}
}

// A nacked message (ack deadline 0) comes back to a waiting Pull without
// any publish to wake it; ReturnImmediately is answered at once; an
// unknown subscription is NOT_FOUND.
func TestPullSeesNackedMessagesAndKeepsPstestSemantics(t *testing.T) {
	c := setup(t)
	subs := c.PubSub().SubscriptionAdminClient
	ctx := context.Background()
	for i := range 3 {
		publish(t, c, fmt.Sprint(i), fmt.Sprint("k", i))
	}
	resp, err := subs.Pull(ctx, &pb.PullRequest{Subscription: sub, MaxMessages: 10, ReturnImmediately: true})
	if err != nil || len(resp.GetReceivedMessages()) != 3 {
		t.Fatalf("ReturnImmediately Pull: %v messages, %v; want 3", len(resp.GetReceivedMessages()), err)
	}
	first := resp.GetReceivedMessages()[0]
	var rest []string
	for _, m := range resp.GetReceivedMessages()[1:] {
		rest = append(rest, m.GetAckId())
	}
	if err := subs.Acknowledge(ctx, &pb.AcknowledgeRequest{Subscription: sub, AckIds: rest}); err != nil {
		t.Fatal(err)
	}
	if err := subs.ModifyAckDeadline(ctx, &pb.ModifyAckDeadlineRequest{Subscription: sub, AckIds: []string{first.GetAckId()}}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err = subs.Pull(wctx, &pb.PullRequest{Subscription: sub, MaxMessages: 10})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetReceivedMessages(); len(got) != 1 || got[0].GetMessage().GetMessageId() != first.GetMessage().GetMessageId() {
		t.Fatalf("after a nack Pull answered %v, want the nacked message again", got)
	}
	_, err = subs.Pull(ctx, &pb.PullRequest{Subscription: "projects/p/subscriptions/nope", MaxMessages: 1})
	if status.Code(err) != codes.NotFound {
		t.Errorf("Pull on an unknown subscription: %v, want NOT_FOUND", err)
	}
}

// A Pull whose caller went away while pstest was taking its messages (a
// process killed mid-pull) hands them back: the next Pull gets them at
// once, not after the subscription's ack deadline.
func TestPullOfAGoneCallerHandsItsMessagesBack(t *testing.T) {
	srv, c := serve(t, Options{})
	subscribe(t, c, false, 60)
	ctx := context.Background()
	publish(t, c, "order-1", "")

	gone, cancel := context.WithCancel(ctx)
	pullThenGo := func(_ context.Context, req any) (any, error) {
		resp, err := srv.fake.GServer.Pull(ctx, req.(*pb.PullRequest))
		cancel() // the caller dies while the answer is on its way
		return resp, err
	}
	info := &grpc.UnaryServerInfo{FullMethod: pb.Subscriber_Pull_FullMethodName}
	if _, err := srv.intercept(gone, &pb.PullRequest{Subscription: sub, MaxMessages: 10, ReturnImmediately: true}, info, pullThenGo); status.Code(err) != codes.Canceled {
		t.Fatalf("the gone caller's Pull: %v, want CANCELED", err)
	}
	resp, err := c.PubSub().SubscriptionAdminClient.Pull(ctx, &pb.PullRequest{Subscription: sub, MaxMessages: 10, ReturnImmediately: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetReceivedMessages(); len(got) != 1 || string(got[0].GetMessage().GetData()) != "order-1" {
		t.Fatalf("the next Pull got %v, want order-1 at once", got)
	}
}

// With PullLease, what a caller pulled and never touched again comes back
// after the lease, not after the subscription's ack deadline (60 s here).
func TestPullLeaseBringsBackWhatACallerAbandoned(t *testing.T) {
	_, c := serve(t, Options{PullLease: time.Second})
	subscribe(t, c, false, 60)
	ctx := context.Background()
	subs := c.PubSub().SubscriptionAdminClient
	publish(t, c, "order-1", "")
	resp, err := subs.Pull(ctx, &pb.PullRequest{Subscription: sub, MaxMessages: 10, ReturnImmediately: true})
	if err != nil || len(resp.GetReceivedMessages()) != 1 {
		t.Fatalf("first Pull: %d messages, %v", len(resp.GetReceivedMessages()), err)
	}
	pulled := time.Now()
	wctx, cancel := context.WithTimeout(ctx, 8*time.Second)
	defer cancel()
	resp, err = subs.Pull(wctx, &pb.PullRequest{Subscription: sub, MaxMessages: 10})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetReceivedMessages(); len(got) != 1 || string(got[0].GetMessage().GetData()) != "order-1" {
		t.Fatalf("second Pull got %v, want order-1 again after the 1 s lease", got)
	}
	if d := time.Since(pulled); d > 5*time.Second {
		t.Errorf("came back after %v, want about the 1 s lease", d)
	}
}

// seekTo seeks sub to at through the server.
func seekTo(c *pubsub.Client, at time.Time) error {
	_, err := c.PubSub().SubscriptionAdminClient.Seek(context.Background(), &pb.SeekRequest{Subscription: sub,
		Target: &pb.SeekRequest_Time{Time: timestamppb.New(at)}})
	return err
}

// pullData pulls sub once (waiting up to 2 s) and returns the messages'
// data, acknowledging them.
func pullData(t *testing.T, c *pubsub.Client) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := c.PubSub().SubscriptionAdminClient.Pull(ctx, &pb.PullRequest{Subscription: sub, MaxMessages: 10})
	if err != nil {
		t.Fatal(err)
	}
	var got, ids []string
	for _, m := range resp.GetReceivedMessages() {
		got = append(got, string(m.GetMessage().GetData()))
		ids = append(ids, m.GetAckId())
	}
	if len(ids) > 0 {
		if err := c.PubSub().SubscriptionAdminClient.Acknowledge(context.Background(), &pb.AcknowledgeRequest{Subscription: sub, AckIds: ids}); err != nil {
			t.Fatal(err)
		}
	}
	return got
}

// A seek back over a message of the subscription's topic is refused with
// the time that would be accepted, and the server lives on: pstest would
// put the message back without its content and panic delivering it.
func TestSeekBackIsRefusedAndTheServerLivesOn(t *testing.T) {
	c := setup(t)
	before := time.Now()
	publish(t, c, "a", "k")
	err := seekTo(c, before)
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), "a time after") {
		t.Fatalf("seek back over a message: %v, want FailedPrecondition naming the time accepted", err)
	}
	if got := pullData(t, c); fmt.Sprint(got) != "[a]" {
		t.Fatalf("after the refused seek the subscription delivered %v, want [a]", got)
	}
}

// A seek to a time that only another topic's messages follow acknowledges
// what the subscription held before it and puts nothing back; later
// messages are delivered with their content.
func TestSeekPastAnotherTopicsMessages(t *testing.T) {
	c := setup(t)
	publish(t, c, "old", "k")
	const other = "projects/p/topics/other"
	admin := c.PubSub().TopicAdminClient
	if _, err := admin.CreateTopic(context.Background(), &pb.Topic{Name: other}); err != nil {
		t.Fatal(err)
	}
	at := time.Now()
	if _, err := admin.Publish(context.Background(), &pb.PublishRequest{Topic: other, Messages: []*pb.PubsubMessage{{Data: []byte("x")}}}); err != nil {
		t.Fatal(err)
	}
	if err := seekTo(c, at); err != nil {
		t.Fatalf("seek: %v", err)
	}
	// pullData's Pull waits up to 2 s: anything the seek put back (pstest
	// delivers every 10 ms) would come in it.
	if got := pullData(t, c); len(got) != 0 {
		t.Fatalf("after the seek the subscription delivered %v, want nothing (old is before the time)", got)
	}
	publish(t, c, "new", "k")
	if got := pullData(t, c); fmt.Sprint(got) != "[new]" {
		t.Fatalf("after the seek the subscription delivered %v, want [new]", got)
	}
}
