package relay_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"

	"github.com/relaybus/relaybus/internal/pack"
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

// len is how many publish requests the log holds.
func (l *requestLog) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.requests)
}

// since returns the messages of the requests after the first n, in order.
func (l *requestLog) since(n int) []*pb.PubsubMessage {
	l.mu.Lock()
	defer l.mu.Unlock()
	var sent []*pb.PubsubMessage
	for _, req := range l.requests[n:] {
		sent = append(sent, req...)
	}
	return sent
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
	published(t, e, r, aggs, n)
	for v := int64(1); v <= n; v++ {
		for _, a := range aggs {
			repush(t, e, target, a, v)
		}
	}
}

// queuedInOrder is publishedThenRepushed with an aggregate's versions
// queued one after another (as a backfill queues them).
func queuedInOrder(t *testing.T, e *env, r *relay.Relay, target string, aggs []string, n int64) {
	t.Helper()
	published(t, e, r, aggs, n)
	for _, a := range aggs {
		for v := int64(1); v <= n; v++ {
			repush(t, e, target, a, v)
		}
	}
}

// published enqueues versions 1..n of each aggregate and drains them.
func published(t *testing.T, e *env, r *relay.Relay, aggs []string, n int64) {
	t.Helper()
	for _, a := range aggs {
		for v := int64(1); v <= n; v++ {
			if _, err := outbox.Enqueue(context.Background(), e.pool, ev(a, v)); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitDrained(t, r, e.pool)
}

func repush(t *testing.T, e *env, target, agg string, v int64) {
	t.Helper()
	if _, err := outbox.Repush(context.Background(), e.pool, ev(agg, v), target); err != nil {
		t.Fatal(err)
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

// unpacked is what a publish request carried: each message's aggregate
// and version in order, the messages in packs read out of them, and how
// many messages were packs.
func unpacked(t *testing.T, req []*pb.PubsubMessage) (versions map[string][]string, targets map[string]bool, packs int) {
	t.Helper()
	versions, targets = map[string][]string{}, map[string]bool{}
	for _, m := range req {
		msgs := []event.Message{{ID: "m", Data: m.Data, Attributes: m.Attributes, OrderingKey: m.OrderingKey}}
		if pack.Is(msgs[0]) {
			packs++
			var err error
			if msgs, err = pack.Decode(msgs[0]); err != nil {
				t.Fatalf("a pack does not decode: %v", err)
			}
			if m.Attributes[topology.TargetConsumerAttr] == "" {
				t.Errorf("a pack of %s has no %s", m.OrderingKey, topology.TargetConsumerAttr)
			}
		}
		for _, im := range msgs {
			if im.OrderingKey != im.Attributes["aggregate_id"] {
				t.Errorf("%s v%s travelled under ordering key %q", im.Attributes["aggregate_id"], im.Attributes["version"], im.OrderingKey)
			}
			versions[im.Attributes["aggregate_id"]] = append(versions[im.Attributes["aggregate_id"]], im.Attributes["version"])
			targets[im.Attributes[topology.TargetConsumerAttr]] = true
		}
	}
	return versions, targets, packs
}

// Re-pushes of one aggregate to one consumer the topology declares (push,
// no filter) queued one after another go out as packs of up to MaxPack,
// each aggregate's versions once, in order, addressed to the consumer;
// MaxPack 1 sends each alone.
func TestRepushesOfAnAggregateTravelInPacks(t *testing.T) {
	for _, tc := range []struct {
		maxPack, wantMsgs, wantPacks int
	}{
		{maxPack: 0, wantMsgs: 6, wantPacks: 6}, // DefaultMaxPack (100): 250 versions in 3 packs each
		{maxPack: 1, wantMsgs: 500, wantPacks: 0},
	} {
		t.Run(fmt.Sprint("MaxPack=", tc.maxPack), func(t *testing.T) {
			ctx := context.Background()
			log := &requestLog{recorder: newRecorder()}
			e := newEnvWith(t, log)
			r := e.relay(t, relay.Options{MaxPack: tc.maxPack})
			aggs := []string{"order-a", "order-b"}
			queuedInOrder(t, e, r, "member-service", aggs, 250)
			before := log.len()
			total := 0
			for total < 500 {
				sum, err := r.Drain(ctx, time.Minute)
				if err != nil || sum.Repushed == 0 {
					t.Fatalf("drain: %+v %v, with %d of 500 re-pushed", sum, err, total)
				}
				total += sum.Repushed
			}
			sent := log.since(before)
			versions, targets, packs := unpacked(t, sent)
			if len(sent) != tc.wantMsgs || packs != tc.wantPacks {
				t.Errorf("500 re-pushes went out as %d messages, %d of them packs; want %d and %d", len(sent), packs, tc.wantMsgs, tc.wantPacks)
			}
			want := []string{}
			for v := 1; v <= 250; v++ {
				want = append(want, fmt.Sprint(v))
			}
			for _, a := range aggs {
				if !slices.Equal(versions[a], want) {
					t.Errorf("%s re-pushed %v, want versions 1..250 once each, in order", a, versions[a])
				}
			}
			if len(targets) != 1 || !targets["member-service"] {
				t.Errorf("the re-pushed events were addressed to %v, want member-service alone", targets)
			}
		})
	}
}

// Re-pushes go alone, not in packs, where a pack would not be read as its
// events: to a consumer with an extra filter (it reads each event's
// attributes), on Eventarc (no delivery attempt to tell a pack's last
// delivery by), to one the topology does not declare (a forwarder added
// at run time), and on a topic with a schema (the broker validates each
// message's data). A declared push consumer beside them gets packs.
func TestRepushesGoAloneWhereAPackWouldNotBeRead(t *testing.T) {
	ctx := context.Background()
	src, err := os.ReadFile("../../infra/topology.yaml")
	if err != nil {
		t.Fatal(err)
	}
	const decl = "      - service: member-service\n"
	if !strings.Contains(string(src), decl) {
		t.Fatalf("infra/topology.yaml declares no %q", decl)
	}
	// member-service filtered; points-service declared beside it, unfiltered.
	filtered := strings.Replace(string(src), decl, "      - service: points-service\n        handler: projection\n"+
		decl+"        filter: attributes.event_type = \"order.purchased\"\n", 1)
	path := filepath.Join(t.TempDir(), "topology.yaml")
	if err := os.WriteFile(path, []byte(filtered), 0o600); err != nil {
		t.Fatal(err)
	}
	top, err := topology.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	log := &requestLog{recorder: newRecorder()}
	e := newEnvWith(t, log)
	r := e.relay(t, relay.Options{})
	type target struct{ topic, agg, consumer string }
	targets := []target{
		{topic, "order-a", "member-service"},             // an extra filter
		{topic, "order-b", "message-service"},            // Eventarc
		{topic, "order-c", "crm-webhook"},                // not declared: a forwarder added at run time
		{"member.points.events", "m-1", "audit-service"}, // a topic with a schema
		{topic, "order-d", "points-service"},             // declared, push, no filter: packs
	}
	evOf := func(tg target, v int64) *event.Event {
		x := ev(tg.agg, v)
		x.Topic = tg.topic
		if tg.topic != topic {
			x.AggregateType, x.Payload, x.PayloadType = "member", []byte("points"), "application/protobuf"
		}
		return x
	}
	for _, tg := range targets {
		for v := int64(1); v <= 10; v++ {
			if _, err := outbox.Enqueue(ctx, e.pool, evOf(tg, v)); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitDrained(t, r, e.pool)
	for _, tg := range targets {
		for v := int64(1); v <= 10; v++ {
			if _, err := outbox.Repush(ctx, e.pool, evOf(tg, v), tg.consumer); err != nil {
				t.Fatal(err)
			}
		}
	}
	e.top = top
	r = e.relay(t, relay.Options{})
	before := log.len()
	if sum, err := r.Drain(ctx, time.Minute); err != nil || sum.Repushed != 50 {
		t.Fatalf("drain: %+v %v, want 50 re-pushed", sum, err)
	}
	sent := log.since(before)
	versions, _, packs := unpacked(t, sent)
	if len(sent) != 41 || packs != 1 {
		t.Errorf("sent %d messages, %d of them packs; want 40 alone and points-service's 10 in one pack", len(sent), packs)
	}
	for _, tg := range targets {
		if len(versions[tg.agg]) != 10 {
			t.Errorf("%s re-pushed %v, want its 10 versions", tg.agg, versions[tg.agg])
		}
	}
}
