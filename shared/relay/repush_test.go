package relay_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"

	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/internal/pubsubtest"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/relay"
	"github.com/relaybus/relaybus/shared/topology"
)

// newEnvWith is newEnv with log watching the publish requests.
func newEnvWith(t *testing.T, log *requestLog) *env {
	t.Helper()
	pool := pgtest.Schema(t)
	if err := outbox.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	fake := pubsubtest.New(t, pstest.ServerReactorOption{FuncName: "Publish", Reactor: log})
	top, err := topology.Load("")
	if err != nil {
		t.Fatal(err)
	}
	fake.Provision(t, top)
	return &env{pool: pool, fake: fake, rec: log.recorder, top: top}
}

// requestLog keeps the publish requests the relay sent Pub/Sub, refused
// ones included, and hands each to its recorder.
type requestLog struct {
	*recorder
	requests [][]*pb.PubsubMessage
}

func (l *requestLog) React(req any) (bool, any, error) {
	l.mu.Lock()
	l.requests = append(l.requests, req.(*pb.PublishRequest).Messages)
	l.mu.Unlock()
	return l.recorder.React(req)
}

// publishedThenRepushed enqueues versions 1..n of each aggregate, drains
// them (their first publish) and queues a re-push of each to target, the
// aggregates' versions interleaved in the queue (a1 v1, a2 v1, a1 v2, …).
func publishedThenRepushed(t *testing.T, e *env, r *relay.Relay, target string, aggs []string, n int64) {
	t.Helper()
	ctx := context.Background()
	for _, a := range aggs {
		for v := int64(1); v <= n; v++ {
			if _, err := outbox.Enqueue(ctx, e.pool, ev(a, v)); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitDrained(t, r, e.pool)
	for v := int64(1); v <= n; v++ {
		for _, a := range aggs {
			if _, err := outbox.Repush(ctx, e.pool, ev(a, v), target); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// Re-pushes of one topic go out together, one publish request for a
// claim's worth, not one each, and each message keeps its ordering key,
// its place in its key's order and its target consumer.
func TestRepushesOfATopicShareAPublishRequest(t *testing.T) {
	ctx := context.Background()
	log := &requestLog{recorder: newRecorder()}
	e := newEnvWith(t, log)
	r := e.relay(t, relay.Options{})
	aggs := []string{"order-a", "order-b", "order-c"}
	publishedThenRepushed(t, e, r, "new-service", aggs, 20)
	log.mu.Lock()
	before := len(log.requests)
	log.mu.Unlock()

	sum, err := r.Drain(ctx, time.Minute)
	if err != nil || sum.Repushed != 60 {
		t.Fatalf("drain: %+v %v, want 60 re-pushed", sum, err)
	}
	log.mu.Lock()
	reqs := log.requests[before:]
	log.mu.Unlock()
	if len(reqs) != 1 || len(reqs[0]) != 60 {
		sizes := []int{}
		for _, q := range reqs {
			sizes = append(sizes, len(q))
		}
		t.Fatalf("60 re-pushes went out in %d publish requests of %v messages, want one of 60", len(reqs), sizes)
	}
	for _, a := range aggs {
		var got []string
		for _, m := range reqs[0] {
			if m.OrderingKey == a {
				got = append(got, m.Attributes["version"])
				if m.Attributes[topology.TargetConsumerAttr] != "new-service" {
					t.Errorf("%s v%s: target %q, want new-service", a, m.Attributes["version"], m.Attributes[topology.TargetConsumerAttr])
				}
			}
		}
		want := []string{}
		for v := 1; v <= 20; v++ {
			want = append(want, fmt.Sprint(v))
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s re-pushed %v, want its versions once each, in order", a, got)
		}
	}
}

// A batch the broker refuses because of one key's message is published
// again a key at a time: the other keys' re-pushes go out, the refused
// key's are retried from its first, and its versions still reach the
// broker once each and in the order they were queued.
func TestRepushARefusedKeyKeepsItsOrderAndHoldsNoOtherKey(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	clk := &clock{}
	r := e.relay(t, relay.Options{Now: clk.now, BackoffBase: time.Second, BackoffMax: time.Second})
	aggs := []string{"order-a", "order-b", "order-c"}
	publishedThenRepushed(t, e, r, "", aggs, 3)
	e.rec.mu.Lock()
	e.rec.seen = map[string][]int64{} // the first publishes are not what this test reads
	e.rec.fail["order-b"] = 2         // the batch, then order-b's own request
	e.rec.mu.Unlock()

	sum, err := r.Drain(ctx, time.Minute)
	if err != nil || sum.Repushed != 6 {
		t.Fatalf("first drain: %+v %v, want order-a's and order-c's 6 re-pushed", sum, err)
	}
	if got := e.rec.versions("order-b"); len(got) != 0 {
		t.Fatalf("order-b published %v while its first re-push was refused", got)
	}
	clk.add(2 * time.Second)
	if sum, err := r.Drain(ctx, time.Minute); err != nil || sum.Repushed != 3 {
		t.Fatalf("second drain: %+v %v, want order-b's 3 re-pushed", sum, err)
	}
	for _, a := range aggs {
		if got := e.rec.versions(a); !slices.Equal(got, []int64{1, 2, 3}) {
			t.Errorf("%s re-pushed %v, want [1 2 3]", a, got)
		}
	}
}

// slowFirst is a broker whose first publish answers only after a given
// time (a slow request), then as its next does.
type slowFirst struct {
	relay.Publisher
	until time.Time
	slow  atomic.Bool
}

func (p *slowFirst) PublishBatch(ctx context.Context, topic string, msgs []event.Message) (int, error) {
	if p.slow.CompareAndSwap(false, true) {
		time.Sleep(time.Until(p.until))
	}
	return p.Publisher.PublishBatch(ctx, topic, msgs)
}

// A claim of re-pushes is published whole even when the drain's budget
// ends while its request is under way: none of it is failed and left to
// a retry behind the later versions the next claims would publish.
func TestRepushClaimOutlivesTheDrainBudget(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	r := e.relay(t, relay.Options{})
	aggs := []string{"order-a", "order-b"}
	publishedThenRepushed(t, e, r, "", aggs, 3)
	e.rec.mu.Lock()
	e.rec.seen = map[string][]int64{}
	e.rec.mu.Unlock()

	const budget = 300 * time.Millisecond
	slow := &slowFirst{Publisher: e.fake.Client, until: time.Now().Add(budget + 300*time.Millisecond)}
	r2, err := relay.New(relay.Options{DB: e.pool, Publisher: slow, Topology: e.top})
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close(ctx)
	sum, err := r2.Drain(ctx, budget)
	if err != nil || sum.Repushed != 6 {
		t.Fatalf("drain: %+v %v, want the claim's 6 re-pushes published", sum, err)
	}
	for _, a := range aggs {
		if got := e.rec.versions(a); !slices.Equal(got, []int64{1, 2, 3}) {
			t.Errorf("%s re-pushed %v, want [1 2 3]", a, got)
		}
	}
}
