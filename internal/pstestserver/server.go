// Package pstestserver serves pstest, the Go Pub/Sub fake, on an address of
// its own with a Pull that long-polls as Pub/Sub's does, and a Seek that
// cannot crash it (Server.seek). The local stack's in-process pstest is
// served through it too, for that Seek.
//
// The local stack needs a Pub/Sub that outlives it: a stack killed with
// SIGKILL must find its undelivered messages when it starts again, so the
// fake cannot live in the stack's process. The gcloud Pub/Sub emulator
// outlives it, but it starts a thread for every ordering key an ordered
// subscription has seen and never stops it (measured with emulator 0.8.20:
// 200 messages on 200 keys, all acknowledged, left 200 more threads 70 s
// later). relaybus orders by aggregate id, so every new order is a new key:
// at 100 events/s the emulator holds thousands of threads within a minute
// and their timers take the machine's two cores. pstest keeps no per-key
// state, but its own Pull without ReturnImmediately waits a fixed 500 ms
// when nothing is there. This server fixes that in front of pstest: a Pull
// that would wait returns as soon as a message is published to the
// subscription's topic (or within Poll, for messages that come back by a
// lapsed ack deadline or a nack), and answers empty shortly before the
// caller's deadline, never after, so a pull that gave up has taken nothing.
package pstestserver

import (
	"context"
	"net"
	"sync"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Options configures a Server. The zero value is ready to use.
type Options struct {
	// Poll is how often a waiting Pull looks again without a publish to
	// wake it (50 ms).
	Poll time.Duration
	// MaxWait bounds a waiting Pull whose caller set no deadline (10 s).
	MaxWait time.Duration
	// Margin is how long before the caller's deadline a waiting Pull
	// answers empty (300 ms).
	Margin time.Duration
	// PullLease, when set, is the ack deadline pulled messages get instead
	// of their subscription's, as if the caller had extended it at once:
	// the local delivery loop leases what it pulls for 10 s and renews it,
	// but a stack killed between a Pull and that first lease would leave
	// its messages out for the subscription's whole deadline (60 s in the
	// topology). 0 keeps the subscription's.
	PullLease time.Duration
	// Reactors are handed to pstest (the in-process stack's publish
	// wake-up for its delivery loop). None by default.
	Reactors []pstest.ServerReactorOption
}

// Server is pstest behind a gRPC server that long-polls Pull.
type Server struct {
	// Addr is the address clients dial (host:port).
	Addr string

	o    Options
	fake *pstest.Server
	gs   *grpc.Server
	done chan error

	mu     sync.Mutex
	wakes  map[string]chan struct{} // by topic path; closed by a publish
	topics map[string]string        // subscription path → topic path

	closeOnce sync.Once
	closeErr  error

	// order holds publishes back while a Seek looks at what was published
	// and seeks (publishes share it, a Seek holds it alone).
	order sync.RWMutex
}

// Start serves a new, empty fake on addr ("127.0.0.1:0" picks a port).
func Start(addr string, o Options) (*Server, error) {
	if o.Poll <= 0 {
		o.Poll = 50 * time.Millisecond
	}
	if o.MaxWait <= 0 {
		o.MaxWait = 10 * time.Second
	}
	if o.Margin <= 0 {
		o.Margin = 300 * time.Millisecond
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	s := &Server{Addr: l.Addr().String(), o: o, done: make(chan error, 1),
		wakes: map[string]chan struct{}{}, topics: map[string]string{}}
	// pstest listens on a port of its own too; nobody is told about it.
	s.fake = pstest.NewServerWithAddress("127.0.0.1:0", o.Reactors...)
	s.gs = grpc.NewServer(grpc.UnaryInterceptor(s.intercept))
	pb.RegisterPublisherServer(s.gs, &s.fake.GServer)
	pb.RegisterSubscriberServer(s.gs, &s.fake.GServer)
	pb.RegisterSchemaServiceServer(s.gs, &s.fake.GServer)
	go func() { s.done <- s.gs.Serve(l) }()
	return s, nil
}

// Close stops serving. It does not close pstest itself, whose Close can
// wait on its own delivery goroutines; end the process instead.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.gs.Stop()
		s.closeErr = <-s.done
	})
	return s.closeErr
}

// Shutdown stops serving and closes pstest too, for a server that lives in
// a process that goes on: it waits for pstest until ctx ends, no longer,
// since pstest's Close can deadlock on its own delivery goroutines after
// heavy use.
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.Close()
	done := make(chan struct{})
	go func() { _ = s.fake.Close(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	return err
}

func (s *Server) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	switch info.FullMethod {
	case pb.Publisher_Publish_FullMethodName:
		s.order.RLock()
		resp, err := handler(ctx, req)
		s.order.RUnlock()
		if err == nil {
			s.notify(req.(*pb.PublishRequest).GetTopic())
		}
		return resp, err
	case pb.Subscriber_Pull_FullMethodName:
		r := req.(*pb.PullRequest)
		var resp any
		var err error
		if r.GetReturnImmediately() {
			resp, err = handler(ctx, req)
		} else {
			resp, err = s.longPull(ctx, r, handler)
		}
		if err == nil && ctx.Err() != nil {
			// The caller is gone (a process killed mid-pull) and will never
			// see these messages: hand them back at once rather than leave
			// them out for the subscription's whole ack deadline.
			s.setDeadline(r.GetSubscription(), resp.(*pb.PullResponse), 0)
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		if err == nil && s.o.PullLease > 0 {
			s.setDeadline(r.GetSubscription(), resp.(*pb.PullResponse), s.o.PullLease)
		}
		return resp, err
	case pb.Subscriber_Seek_FullMethodName:
		return s.seek(ctx, req.(*pb.SeekRequest), handler)
	case pb.Subscriber_DeleteSubscription_FullMethodName:
		s.mu.Lock()
		delete(s.topics, req.(*pb.DeleteSubscriptionRequest).GetSubscription())
		s.mu.Unlock()
	}
	return handler(ctx, req)
}

// seek runs the seeks to a time that pstest can run and refuses the rest.
//
// pstest (v2.8.0) cannot seek back. Its Seek puts every message published
// at or after the time back on the subscription, those of every topic,
// without their content, and its delivery goroutine then dereferences the
// missing content and panics, which ends the process and every message it
// holds. So:
//   - a seek back over messages of the subscription's own topic is
//     refused with FailedPrecondition, as Pub/Sub refuses a time it cannot
//     reach, saying which time would be accepted;
//   - a seek to a time that only other topics' messages follow goes to
//     just after the last publish instead: the subscription's messages it
//     acknowledges are the same (its messages are its topic's: nothing
//     here dead-letters into a topic through pstest's own policy), and
//     pstest puts nothing back.
//
// Publishes wait while it runs, so that none lands between the look and
// the seek. A seek to a snapshot goes to pstest, which answers
// Unimplemented.
func (s *Server) seek(ctx context.Context, req *pb.SeekRequest, handler grpc.UnaryHandler) (any, error) {
	if req.GetTime() == nil {
		return handler(ctx, req)
	}
	s.order.Lock()
	defer s.order.Unlock()
	topic, err := s.topicOf(ctx, req.GetSubscription())
	if err != nil {
		return nil, err
	}
	at := req.GetTime().AsTime()
	var last, lastOwn time.Time
	own := 0
	for _, m := range s.fake.Messages() {
		pt := m.PublishTime.Round(0) // the wall clock, as pstest's Seek compares
		if pt.After(last) {
			last = pt
		}
		if m.Topic == topic && !pt.Before(at) {
			own++
			if pt.After(lastOwn) {
				lastOwn = pt
			}
		}
	}
	if own > 0 {
		return nil, status.Errorf(codes.FailedPrecondition,
			"the local Pub/Sub (pstest) cannot seek back: %d message(s) of %s were published at or after %s and it cannot deliver them again "+
				"(Pub/Sub and JetStream can); a time after %s is accepted",
			own, topic, at.UTC().Format(time.RFC3339Nano), lastOwn.UTC().Format(time.RFC3339Nano))
	}
	if !last.Before(at) {
		req = proto.Clone(req).(*pb.SeekRequest)
		req.Target = &pb.SeekRequest_Time{Time: timestamppb.New(last.Add(time.Microsecond))}
	}
	return handler(ctx, req)
}

// longPull answers at once when messages are there, else waits for a
// publish to the subscription's topic, looking again every Poll, and
// answers empty Margin before the caller's deadline.
func (s *Server) longPull(ctx context.Context, req *pb.PullRequest, handler grpc.UnaryHandler) (any, error) {
	topic, err := s.topicOf(ctx, req.GetSubscription())
	if err != nil {
		return nil, err
	}
	until := time.Now().Add(s.o.MaxWait)
	if d, ok := ctx.Deadline(); ok && d.Add(-s.o.Margin).Before(until) {
		until = d.Add(-s.o.Margin)
	}
	now := proto.Clone(req).(*pb.PullRequest)
	now.ReturnImmediately = true
	poll := time.NewTicker(s.o.Poll)
	defer poll.Stop()
	for {
		wake := s.listen(topic) // before pulling: a publish in between still wakes us
		resp, err := handler(ctx, now)
		if err != nil || len(resp.(*pb.PullResponse).GetReceivedMessages()) > 0 {
			return resp, err
		}
		left := time.Until(until)
		if left <= 0 {
			return resp, nil
		}
		t := time.NewTimer(left)
		select {
		case <-wake:
		case <-poll.C:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		t.Stop()
	}
}

// setDeadline sets the ack deadline of pulled messages (0 nacks them:
// delivered again at once).
func (s *Server) setDeadline(sub string, resp *pb.PullResponse, d time.Duration) {
	var ids []string
	for _, m := range resp.GetReceivedMessages() {
		ids = append(ids, m.GetAckId())
	}
	if len(ids) == 0 {
		return
	}
	_, _ = s.fake.GServer.ModifyAckDeadline(context.Background(), &pb.ModifyAckDeadlineRequest{Subscription: sub, AckIds: ids,
		AckDeadlineSeconds: int32((d + time.Second - 1) / time.Second)})
}

// topicOf returns the topic of a subscription, asking pstest once.
func (s *Server) topicOf(ctx context.Context, sub string) (string, error) {
	s.mu.Lock()
	t, ok := s.topics[sub]
	s.mu.Unlock()
	if ok {
		return t, nil
	}
	got, err := s.fake.GServer.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: sub})
	if err != nil {
		return "", err
	}
	s.mu.Lock()
	s.topics[sub] = got.GetTopic()
	s.mu.Unlock()
	return got.GetTopic(), nil
}

// listen returns a channel closed by the next publish to topic.
func (s *Server) listen(topic string) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.wakes[topic]
	if !ok {
		c = make(chan struct{})
		s.wakes[topic] = c
	}
	return c
}

// notify wakes every Pull waiting on topic.
func (s *Server) notify(topic string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.wakes[topic]; ok {
		close(c)
		delete(s.wakes, topic)
	}
}
