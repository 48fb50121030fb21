package devstack

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/relaybus/relaybus/internal/pubsubtest"
	"github.com/relaybus/relaybus/shared/deadletter"
	"github.com/relaybus/relaybus/shared/delivery"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/names"
	"github.com/relaybus/relaybus/shared/topology"
)

// loopFixture is a pstest server with one topic and its dead-letter topic,
// and an HTTP endpoint whose answers the test decides.
type loopFixture struct {
	t     *testing.T
	fake  *pubsubtest.Fake
	topic string

	mu        sync.Mutex
	got       []received
	inFlight  map[string]int // by ordering key
	maxPerKey int
	maxTotal  int
	total     int
	answer    func(d delivery.Delivery, n int) int // n: the how-many-th request this message is
	perMsg    map[string]int
	hold      time.Duration
}

type received struct {
	at time.Time
	d  delivery.Delivery
	r  *http.Request
}

func newLoopFixture(t *testing.T) *loopFixture {
	f := &loopFixture{t: t, fake: pubsubtest.New(t), topic: "test.loop.events",
		inFlight: map[string]int{}, perMsg: map[string]int{}}
	f.mkTopic(f.topic)
	f.mkTopic(names.DeadLetter(f.topic))
	return f
}

func (f *loopFixture) path(kind, id string) string {
	return "projects/" + pubsubtest.Project + "/" + kind + "/" + id
}

func (f *loopFixture) mkTopic(id string) {
	f.t.Helper()
	if _, err := f.fake.Client.PubSub().TopicAdminClient.CreateTopic(context.Background(), &pb.Topic{Name: f.path("topics", id)}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *loopFixture) mkSub(s *pb.Subscription) {
	f.t.Helper()
	s.Name = f.path("subscriptions", s.Name)
	s.Topic = f.path("topics", s.Topic)
	if _, err := f.fake.Client.PubSub().SubscriptionAdminClient.CreateSubscription(context.Background(), s); err != nil {
		f.t.Fatal(err)
	}
}

// serve starts the endpoint; every request is decoded as consume would.
func (f *loopFixture) serve() string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, err := delivery.Read(r, 0)
		if err != nil {
			f.t.Errorf("the loop sent a request consume cannot read: %v", err)
			w.WriteHeader(http.StatusOK)
			return
		}
		key := d.Message.OrderingKey
		f.mu.Lock()
		f.got = append(f.got, received{at: time.Now(), d: d, r: r})
		f.perMsg[d.Message.ID]++
		n := f.perMsg[d.Message.ID]
		f.inFlight[key]++
		f.total++
		f.maxPerKey = max(f.maxPerKey, f.inFlight[key])
		f.maxTotal = max(f.maxTotal, f.total)
		answer, hold := f.answer, f.hold
		f.mu.Unlock()
		time.Sleep(hold)
		code := http.StatusOK
		if answer != nil {
			code = answer(d, n)
		}
		f.mu.Lock()
		f.inFlight[key]--
		f.total--
		f.mu.Unlock()
		w.WriteHeader(code)
	}))
	f.t.Cleanup(srv.Close)
	return srv.URL
}

func (f *loopFixture) run(routes ...Route) *Loop {
	ctx, cancel := context.WithCancel(context.Background())
	l := &Loop{Client: f.fake.Client, Project: pubsubtest.Project, BackoffScale: 0.1}
	done := make(chan struct{})
	go func() { l.Run(ctx, routes); close(done) }()
	f.t.Cleanup(func() { cancel(); <-done })
	return l
}

func (f *loopFixture) publish(key string, i int) {
	f.t.Helper()
	_, err := f.fake.Client.Publish(context.Background(), f.topic, event.Message{
		Data: []byte(fmt.Sprintf(`{"n":%d}`, i)), OrderingKey: key,
		Attributes: map[string]string{"key": key, "n": strconv.Itoa(i)}})
	if err != nil {
		f.t.Fatal(err)
	}
}

// wait polls until cond holds (under the fixture's lock) or fails the test.
func (f *loopFixture) wait(what string, cond func() bool) {
	f.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		f.mu.Lock()
		ok := cond()
		f.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Per ordering key: one delivery in flight, in publish order; different keys
// in parallel. On an ordered subscription pstest already hands out one
// message per key; on an unordered one it hands out everything at once and
// the loop's own per-key lock keeps one in flight.
func TestLoopOneInFlightPerOrderingKey(t *testing.T) {
	for _, ordered := range []bool{true, false} {
		t.Run(fmt.Sprintf("ordered=%v", ordered), func(t *testing.T) {
			f := newLoopFixture(t)
			f.hold = 15 * time.Millisecond
			f.mkSub(&pb.Subscription{Name: "test.loop.events.a-processor", Topic: f.topic, EnableMessageOrdering: ordered})
			url := f.serve()
			keys := []string{"k1", "k2", "k3"}
			const per = 12
			for i := range per {
				for _, k := range keys {
					f.publish(k, i)
				}
			}
			f.run(Route{Subscription: "test.loop.events.a-processor", Topic: f.topic, URL: url, Mode: topology.DeliveryPush})
			f.wait("every message", func() bool { return len(f.got) >= per*len(keys) })
			time.Sleep(100 * time.Millisecond) // nothing more may come
			f.mu.Lock()
			defer f.mu.Unlock()
			if len(f.got) != per*len(keys) {
				t.Errorf("%d deliveries, want %d (each message once)", len(f.got), per*len(keys))
			}
			if f.maxPerKey != 1 {
				t.Errorf("up to %d deliveries of one ordering key were in flight at once, want 1", f.maxPerKey)
			}
			if f.maxTotal < 2 {
				t.Errorf("at most %d delivery in flight overall: keys did not proceed in parallel", f.maxTotal)
			}
			if ordered {
				next := map[string]int{}
				for _, g := range f.got {
					k, n := g.d.Message.OrderingKey, g.d.Message.Attributes["n"]
					if n != strconv.Itoa(next[k]) {
						t.Fatalf("key %s: got message %s, want %d (publish order)", k, n, next[k])
					}
					next[k]++
				}
			}
		})
	}
}

// A refused delivery (503, 400, a 3xx: anything push does not count as an
// ack) comes back after the subscription's backoff, doubling, with
// deliveryAttempt counting up; the key's next message waits behind it.
func TestLoopRedeliversAfterTheSubscriptionsBackoff(t *testing.T) {
	f := newLoopFixture(t)
	// Retry policy 1 s..4 s, scaled by the loop's 0.1: 100, 200, 400 ms.
	f.mkSub(&pb.Subscription{Name: "test.loop.events.a-processor", Topic: f.topic, EnableMessageOrdering: true,
		RetryPolicy: &pb.RetryPolicy{MinimumBackoff: durationpb.New(time.Second), MaximumBackoff: durationpb.New(4 * time.Second)}})
	refusals := []int{http.StatusServiceUnavailable, http.StatusBadRequest, http.StatusFound}
	f.answer = func(d delivery.Delivery, n int) int {
		if d.Message.Attributes["n"] == "0" && n <= len(refusals) {
			return refusals[n-1]
		}
		return http.StatusNoContent
	}
	url := f.serve()
	f.publish("k", 0)
	f.publish("k", 1)
	f.run(Route{Subscription: "test.loop.events.a-processor", Topic: f.topic, URL: url, Mode: topology.DeliveryPush})
	f.wait("both messages acknowledged", func() bool { return len(f.got) >= 5 })
	time.Sleep(200 * time.Millisecond)
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.got) != 5 {
		t.Fatalf("%d deliveries, want 4 of the first message and 1 of the second", len(f.got))
	}
	wantGaps := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond}
	for i, g := range f.got[:4] {
		if n := g.d.Message.Attributes["n"]; n != "0" {
			t.Fatalf("delivery %d is message %s: the second message overtook the refused first", i+1, n)
		}
		if g.d.Message.DeliveryAttempt != i+1 {
			t.Errorf("delivery %d says deliveryAttempt %d", i+1, g.d.Message.DeliveryAttempt)
		}
		if i > 0 {
			if gap := g.at.Sub(f.got[i-1].at); gap < wantGaps[i-1] {
				t.Errorf("redelivery %d came %v after the refusal, want at least the backoff %v", i, gap, wantGaps[i-1])
			}
		}
	}
	if n := f.got[4].d.Message.Attributes["n"]; n != "1" || f.got[4].d.Message.DeliveryAttempt != 1 {
		t.Errorf("last delivery: message %s attempt %d, want message 1 attempt 1", n, f.got[4].d.Message.DeliveryAttempt)
	}
}

// After MaxAttempts refused deliveries the message goes to <topic>.dlq
// exactly as Pub/Sub's dead-lettering publishes it (original data,
// attributes and ordering key plus the CloudPubSubDeadLetter* attributes)
// and is acknowledged: it is not delivered again, and the key moves on.
func TestLoopDeadLettersAfterMaxAttempts(t *testing.T) {
	f := newLoopFixture(t)
	sub := "test.loop.events.a-processor"
	f.mkSub(&pb.Subscription{Name: sub, Topic: f.topic, EnableMessageOrdering: true})
	f.mkSub(&pb.Subscription{Name: "test.loop.events.dlq-watch", Topic: names.DeadLetter(f.topic)})
	f.answer = func(d delivery.Delivery, n int) int {
		if d.Message.Attributes["n"] == "0" {
			return http.StatusInternalServerError
		}
		return http.StatusOK
	}
	url := f.serve()
	f.publish("k", 0)
	f.publish("k", 1)
	f.run(Route{Subscription: sub, Topic: f.topic, URL: url, Mode: topology.DeliveryPush,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 40 * time.Millisecond, MaxAttempts: 3})

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var (
		dl  *pubsub.Message
		dmu sync.Mutex
	)
	_ = f.fake.Client.PubSub().Subscriber("test.loop.events.dlq-watch").Receive(ctx, func(_ context.Context, m *pubsub.Message) {
		m.Ack()
		dmu.Lock()
		dl = m
		dmu.Unlock()
		cancel()
	})
	if dl == nil {
		t.Fatal("nothing reached the dead-letter topic")
	}
	f.wait("the next message on the key", func() bool { return len(f.got) >= 4 })
	time.Sleep(200 * time.Millisecond)

	f.mu.Lock()
	defer f.mu.Unlock()
	if f.perMsg[f.got[0].d.Message.ID] != 3 {
		t.Errorf("the refused message was delivered %d times, want exactly MaxAttempts = 3", f.perMsg[f.got[0].d.Message.ID])
	}
	if len(f.got) != 4 || f.got[3].d.Message.Attributes["n"] != "1" {
		t.Errorf("%d deliveries; after the dead letter the key's next message should come once", len(f.got))
	}
	orig := f.got[0].d.Message
	if string(dl.Data) != string(orig.Data) || dl.OrderingKey != "k" {
		t.Errorf("dead letter data %q key %q, want the original %q key k", dl.Data, dl.OrderingKey, orig.Data)
	}
	want := map[string]string{
		"key": "k", "n": "0",
		deadletter.AttrSourceSubscription:        sub,
		deadletter.AttrSourceSubscriptionProject: pubsubtest.Project,
		deadletter.AttrSourceDeliveryCount:       "3",
	}
	for k, v := range want {
		if dl.Attributes[k] != v {
			t.Errorf("dead letter attribute %s = %q, want %q", k, dl.Attributes[k], v)
		}
	}
	if pt, err := time.Parse(time.RFC3339Nano, dl.Attributes[deadletter.AttrSourceTopicPublishTime]); err != nil || !pt.Equal(orig.PublishTime) {
		t.Errorf("%s = %q, want the original publish time %v", deadletter.AttrSourceTopicPublishTime,
			dl.Attributes[deadletter.AttrSourceTopicPublishTime], orig.PublishTime)
	}
	info := deadletter.Read(event.Message{Attributes: dl.Attributes})
	if info.Reason != deadletter.ReasonMaxDeliveryAttempts || info.Deliveries != 3 || info.Subscription != sub {
		t.Errorf("deadletter.Read = %+v, want reason %s, 3 deliveries, subscription %s", info, deadletter.ReasonMaxDeliveryAttempts, sub)
	}
}

// Each mode's request is the one Google sends: a wrapped push body with
// deliveryAttempt, or Eventarc's binary messagePublished CloudEvent; both
// carry the full subscription path and the message as published.
func TestLoopPostsEachDeliveryModesRequest(t *testing.T) {
	f := newLoopFixture(t)
	f.mkSub(&pb.Subscription{Name: "test.loop.events.p-processor", Topic: f.topic, EnableMessageOrdering: true})
	f.mkSub(&pb.Subscription{Name: "test.loop.events.e-processor", Topic: f.topic, EnableMessageOrdering: true})
	url := f.serve()
	f.publish("order-7", 0)
	f.run(
		Route{Subscription: "test.loop.events.p-processor", Topic: f.topic, URL: url + "/p", Mode: topology.DeliveryPush},
		Route{Subscription: "test.loop.events.e-processor", Topic: f.topic, URL: url + "/e", Mode: topology.DeliveryEventarc},
	)
	f.wait("both deliveries", func() bool { return len(f.got) >= 2 })
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, g := range f.got {
		sub, mode := "test.loop.events.p-processor", delivery.ModePush
		if g.r.URL.Path == "/e" {
			sub, mode = "test.loop.events.e-processor", delivery.ModeEventarc
			if ct := g.r.Header.Get("ce-type"); ct != delivery.MessagePublishedType {
				t.Errorf("eventarc: ce-type %q, want %s", ct, delivery.MessagePublishedType)
			}
			if g.d.Message.DeliveryAttempt != 0 {
				t.Errorf("eventarc says deliveryAttempt %d; Eventarc's request has none", g.d.Message.DeliveryAttempt)
			}
		} else if g.d.Message.DeliveryAttempt != 1 {
			t.Errorf("push: deliveryAttempt %d, want 1", g.d.Message.DeliveryAttempt)
		}
		if g.d.Mode != mode || g.d.Subscription != f.path("subscriptions", sub) {
			t.Errorf("%s: mode %q subscription %q, want %q %q", g.r.URL.Path, g.d.Mode, g.d.Subscription, mode, f.path("subscriptions", sub))
		}
		m := g.d.Message
		if string(m.Data) != `{"n":0}` || m.OrderingKey != "order-7" || m.Attributes["n"] != "0" || m.ID == "" || m.PublishTime.IsZero() {
			t.Errorf("%s: message %+v is not the one published", g.r.URL.Path, m)
		}
	}
}

func TestAckedStatuses(t *testing.T) {
	for code, want := range map[int]bool{102: true, 200: true, 201: true, 202: true, 204: true,
		203: false, 206: false, 302: false, 400: false, 404: false, 409: false, 429: false, 500: false, 503: false} {
		if acked(code) != want {
			t.Errorf("acked(%d) = %v, want %v", code, !want, want)
		}
	}
}

func TestBackoffDoublesUpToTheMaximum(t *testing.T) {
	lo, hi := 100*time.Millisecond, time.Second
	for n, want := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 3: 400 * time.Millisecond,
		4: 800 * time.Millisecond, 5: time.Second, 9: time.Second} {
		if got := backoff(lo, hi, n); got != want {
			t.Errorf("backoff after refusal %d = %v, want %v", n, got, want)
		}
	}
}
