// Package brokertest is the conformance suite every relaybus broker driver
// passes (as River's driver suite and Watermill's tests.TestPubSub are for
// theirs): its own tests run it on Pub/Sub on pstest and on the gcloud
// emulator (shared/broker/pubsub) and on NATS JetStream on an embedded
// server (shared/broker/nats, the server from brokertest/natstest). Each
// test provisions what it needs through the driver's own Provision and
// drives the broker through the contract of shared/broker alone, and
// through the pull worker (internal/pull) on top of it.
//
// What a backend cannot do is declared in its Capabilities, and the suite
// then asserts the documented behaviour instead (a broker without
// publish deduplication delivers a repeated publish twice), so a change
// either way fails the suite rather than passing silently.
package brokertest

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/deadletter"
	"github.com/relaybus/relaybus/internal/delivery"
	"github.com/relaybus/relaybus/internal/eventually"
	"github.com/relaybus/relaybus/internal/names"
	"github.com/relaybus/relaybus/internal/pull"
	"github.com/relaybus/relaybus/shared/broker"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/topology"
)

// Capabilities say what a backend does that not all do.
type Capabilities struct {
	// DedupOnEventID: a message published again with the same event_id
	// (within the broker's window) is stored once. Without it the
	// consumers' inboxes absorb the duplicate.
	DedupOnEventID bool
	// DeliveryAttemptCount: a pulled message carries the broker's delivery
	// count (Pub/Sub fills it only on subscriptions with a dead-letter
	// policy, which pstest cannot run; JetStream always).
	DeliveryAttemptCount bool
	// FiltersByTarget: a message addressed to one consumer
	// (topology.TargetConsumerAttr, a targeted replay) never reaches the
	// other consumers' subscriptions (Pub/Sub's subscription filter,
	// topology.Consumer.ReplayFilter). Without it, it reaches them with the
	// attribute intact, and their engines acknowledge it unapplied.
	FiltersByTarget bool
}

// Backend is one driver under test. The suite provisions what each test
// needs through the driver's own Provision (broker.Provisioner), from a
// topology of one topic with AckDeadline as its consumers' ack deadline.
type Backend struct {
	// Open connects a new client to the same broker; the suite closes it.
	Open func(t *testing.T) broker.Broker
	// AckDeadline is the lease of the subscriptions the suite provisions
	// (whole seconds): the suite waits it out to see an unacknowledged
	// message come back.
	AckDeadline time.Duration
	Caps        Capabilities
}

var seq int64
var seqMu sync.Mutex

// names returns a fresh topic and its subscriptions per test.
func fresh() (topic, sub, dlqSub string) {
	seqMu.Lock()
	seq++
	n := seq
	seqMu.Unlock()
	topic = fmt.Sprintf("conf.t%d-%d.events", time.Now().UnixNano()%1_000_000, n)
	return topic, topic + ".worker-projection", names.DeadLetterMonitor(topic)
}

func message(key string, n int) event.Message {
	id := fmt.Sprintf("%s-%d", key, n)
	return event.Message{Data: []byte(id), OrderingKey: key,
		Attributes: map[string]string{event.AttrEventID: id, event.AttrAggregateID: key, "n": strconv.Itoa(n)}}
}

// Run runs the suite.
func Run(t *testing.T, b Backend) {
	t.Run("PublishAndReceive", func(t *testing.T) { publishAndReceive(t, b) })
	t.Run("BatchKeepsEachKeysOrder", func(t *testing.T) { batchOrder(t, b) })
	t.Run("IdempotentPublishOnEventID", func(t *testing.T) { idempotent(t, b) })
	t.Run("NackRedeliversAfterBackoff", func(t *testing.T) { backoff(t, b) })
	t.Run("CrashRedeliversAfterReconnect", func(t *testing.T) { crash(t, b) })
	t.Run("TargetedReplayReachesOneConsumer", func(t *testing.T) { targeted(t, b) })
	t.Run("WorkerKeepsKeyOrderUnderRetries", func(t *testing.T) { workerOrder(t, b) })
	t.Run("WorkerDeadLettersAfterMaxAttempts", func(t *testing.T) { workerDeadLetters(t, b) })
	t.Run("WorkerAcksOnlyAfterTheEngineAnswers", func(t *testing.T) { workerShutdown(t, b) })
	t.Run("WorkerKeepsKeyOrderWhenLeasesLapse", func(t *testing.T) { workerLapse(t, b) })
}

// setup connects a client and provisions a fresh topic with its
// <topic>.dlq and a consumer "worker" (role projection), returning the
// topic, the consumer's subscription and the DLQ monitor's.
func setup(t *testing.T, b Backend) (broker.Broker, string, string, string) {
	t.Helper()
	c := b.Open(t)
	t.Cleanup(func() { _ = c.Close() })
	topic, sub, dlq := fresh()
	provision(t, b, c, topic, "worker")
	return c, topic, sub, dlq
}

// provision provisions topic with a consumer (role projection) per
// service, through the driver's Provision.
func provision(t *testing.T, b Backend, c broker.Broker, topic string, services ...string) {
	t.Helper()
	ack := int(b.AckDeadline / time.Second)
	tp := topology.Topic{Name: topic, MessageRetentionSeconds: 3600}
	for _, s := range services {
		tp.Consumers = append(tp.Consumers, topology.Consumer{Topic: topic, Service: s, Role: "projection",
			AckDeadlineSeconds: ack, MinBackoffSeconds: 1, MaxBackoffSeconds: 600})
	}
	top := &topology.Topology{Defaults: topology.Settings{AckDeadlineSeconds: ack},
		Rollup: topology.Rollup{Topic: strings.TrimSuffix(topic, ".events") + ".rollup"}, Topics: []topology.Topic{tp}}
	if err := c.Provision(context.Background(), top); err != nil {
		t.Fatalf("provision %s: %v", topic, err)
	}
}

// pullN pulls until n messages arrived or d passed, acknowledging each
// when ack is set.
func pullN(t *testing.T, c pull.Source, sub string, n int, d time.Duration, ack bool) []pull.Leased {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var got []pull.Leased
	for len(got) < n && ctx.Err() == nil {
		ls, err := c.Pull(ctx, sub, n-len(got))
		if err != nil && ctx.Err() == nil {
			t.Fatalf("pull %s: %v", sub, err)
		}
		for _, l := range ls {
			if ack {
				if err := l.Ack(context.Background()); err != nil {
					t.Fatalf("ack: %v", err)
				}
			}
			got = append(got, l)
		}
	}
	return got
}

func publishAndReceive(t *testing.T, b Backend) {
	c, topic, sub, _ := setup(t, b)
	m := message("order-1", 1)
	m.Attributes[event.AttrContentType] = event.MediaTypeCloudEventsJSON
	id, err := c.Publish(context.Background(), topic, m)
	if err != nil || id == "" {
		t.Fatalf("publish: id %q, %v", id, err)
	}
	got := pullN(t, c, sub, 1, 10*time.Second, true)
	if len(got) != 1 {
		t.Fatalf("received %d messages, want 1", len(got))
	}
	r := got[0].Message()
	if string(r.Data) != "order-1-1" || r.OrderingKey != "order-1" || r.ID != id || r.Topic != topic {
		t.Errorf("received data %q key %q id %q topic %q; want order-1-1, order-1, %q, %q", r.Data, r.OrderingKey, r.ID, r.Topic, id, topic)
	}
	for k, v := range m.Attributes {
		if r.Attributes[k] != v {
			t.Errorf("attribute %s = %q, want %q", k, r.Attributes[k], v)
		}
	}
	if r.PublishTime.IsZero() {
		t.Error("no publish time")
	}
	if b.Caps.DeliveryAttemptCount && r.DeliveryAttempt != 1 {
		t.Errorf("delivery attempt %d, want 1", r.DeliveryAttempt)
	}
	// An odd key (spaces, dots) travels intact.
	odd := message("tenant 7/order.9", 1)
	if _, err := c.Publish(context.Background(), topic, odd); err != nil {
		t.Fatal(err)
	}
	got = pullN(t, c, sub, 1, 10*time.Second, true)
	if len(got) != 1 || got[0].Message().OrderingKey != odd.OrderingKey {
		t.Fatalf("odd key not received intact: %d messages", len(got))
	}
}

// targeted: a replay addressed to one consumer reaches that consumer's
// subscription, in its key's order, and the others' only where the
// broker cannot filter (then marked, so their engines skip it).
func targeted(t *testing.T, b Backend) {
	c, topic, _, _ := setup(t, b)
	provision(t, b, c, topic, "alpha", "beta")
	alpha, beta := topic+".alpha-projection", topic+".beta-projection"
	replay := message("k", 1)
	replay.Attributes[topology.TargetConsumerAttr] = "alpha"
	// The replay, then an ordinary message of the same key: a subscription
	// has seen the replay, or skipped it, once the second one arrives.
	for _, m := range []event.Message{replay, message("k", 2)} {
		if _, err := c.Publish(context.Background(), topic, m); err != nil {
			t.Fatal(err)
		}
	}
	received := func(sub string) []string {
		var got []string
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		for ctx.Err() == nil && (len(got) == 0 || got[len(got)-1] != "k-2") {
			ls, err := c.Pull(ctx, sub, 10)
			if err != nil && ctx.Err() == nil {
				t.Fatalf("pull %s: %v", sub, err)
			}
			for _, l := range ls {
				m := l.Message()
				if err := l.Ack(context.Background()); err != nil {
					t.Fatalf("ack: %v", err)
				}
				id := m.Attributes[event.AttrEventID]
				if target := m.Attributes[topology.TargetConsumerAttr]; id == "k-1" && target != "alpha" {
					t.Errorf("%s: the replay arrived addressed to %q, want alpha", sub, target)
				}
				got = append(got, id)
			}
		}
		return got
	}
	if got := received(alpha); fmt.Sprint(got) != "[k-1 k-2]" {
		t.Errorf("the addressed consumer received %v, want [k-1 k-2]", got)
	}
	want := "[k-1 k-2]" // delivered, marked for the engine to skip
	if b.Caps.FiltersByTarget {
		want = "[k-2]"
	}
	if got := received(beta); fmt.Sprint(got) != want {
		t.Errorf("another consumer received %v, want %s", got, want)
	}
}

func batchOrder(t *testing.T, b Backend) {
	c, topic, sub, _ := setup(t, b)
	const keys, per = 3, 20
	var msgs []event.Message
	for n := 1; n <= per; n++ {
		for k := range keys {
			msgs = append(msgs, message("agg-"+strconv.Itoa(k), n))
		}
	}
	n, err := c.PublishBatch(context.Background(), topic, msgs)
	if err != nil || n != len(msgs) {
		t.Fatalf("PublishBatch = %d, %v; want %d", n, err, len(msgs))
	}
	got := pullN(t, c, sub, len(msgs), 20*time.Second, true)
	if len(got) != len(msgs) {
		t.Fatalf("received %d of %d", len(got), len(msgs))
	}
	last := map[string]int{}
	for _, l := range got {
		m := l.Message()
		v, _ := strconv.Atoi(m.Attributes["n"])
		if v != last[m.OrderingKey]+1 {
			t.Fatalf("key %s: message %d after %d", m.OrderingKey, v, last[m.OrderingKey])
		}
		last[m.OrderingKey] = v
	}
}

// idempotent: the relay's path (PublishBatch) publishing a run again, as
// after a lost acknowledgement, is stored once where the broker dedups on
// the event id; a single Publish sharing that event id (a dead letter from
// another consumer, a rollup notice, a replay) is always stored.
func idempotent(t *testing.T, b Backend) {
	c, topic, sub, _ := setup(t, b)
	ctx := context.Background()
	m := message("k", 1)
	for range 2 {
		if n, err := c.PublishBatch(ctx, topic, []event.Message{m}); err != nil || n != 1 {
			t.Fatalf("PublishBatch = %d, %v", n, err)
		}
	}
	single := m
	single.Data = []byte("k-1-single")
	if _, err := c.Publish(ctx, topic, single); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Publish(ctx, topic, message("k", 2)); err != nil {
		t.Fatal(err)
	}
	// The marker (k-2) comes after whatever the repeat stored.
	want := []string{"k-1", "k-1", "k-1-single", "k-2"}
	if b.Caps.DedupOnEventID {
		want = []string{"k-1", "k-1-single", "k-2"}
	}
	got := pullN(t, c, sub, len(want), 10*time.Second, true)
	got = append(got, pullN(t, c, sub, 1, 1500*time.Millisecond, true)...)
	var ids []string
	for _, l := range got {
		ids = append(ids, string(l.Message().Data))
	}
	if fmt.Sprint(ids) != fmt.Sprint(want) {
		t.Fatalf("received %v; want %v (dedup on event id: %v)", ids, want, b.Caps.DedupOnEventID)
	}
}

func backoff(t *testing.T, b Backend) {
	c, topic, sub, _ := setup(t, b)
	if _, err := c.Publish(context.Background(), topic, message("k", 1)); err != nil {
		t.Fatal(err)
	}
	got := pullN(t, c, sub, 1, 10*time.Second, false)
	if len(got) != 1 {
		t.Fatal("not received")
	}
	const delay = 2 * time.Second
	nacked := time.Now()
	if err := got[0].Nack(context.Background(), delay); err != nil {
		t.Fatal(err)
	}
	again := pullN(t, c, sub, 1, 15*time.Second, true)
	if len(again) != 1 {
		t.Fatal("not redelivered after the nack")
	}
	// Pub/Sub's deadlines are whole seconds, and may be honoured early by
	// up to a second of its clock granularity.
	if waited := time.Since(nacked); waited < delay-time.Second {
		t.Errorf("redelivered after %v, before the backoff of %v", waited, delay)
	}
	if again[0].Message().ID != got[0].Message().ID {
		t.Errorf("redelivered message %s, want %s", again[0].Message().ID, got[0].Message().ID)
	}
	if b.Caps.DeliveryAttemptCount && again[0].Message().DeliveryAttempt != 2 {
		t.Errorf("delivery attempt %d, want 2", again[0].Message().DeliveryAttempt)
	}
}

// crash: a client pulls and dies without acknowledging; a new client gets
// the message again once the lease lapses, and after an ack never again.
func crash(t *testing.T, b Backend) {
	c, topic, sub, _ := setup(t, b)
	if _, err := c.Publish(context.Background(), topic, message("k", 1)); err != nil {
		t.Fatal(err)
	}
	got := pullN(t, c, sub, 1, 10*time.Second, false)
	if len(got) != 1 {
		t.Fatal("not received")
	}
	_ = c.Close() // the crash: no ack, no nack

	c2 := b.Open(t)
	t.Cleanup(func() { _ = c2.Close() })
	again := pullN(t, c2, sub, 1, b.AckDeadline+15*time.Second, false)
	if len(again) != 1 || again[0].Message().ID != got[0].Message().ID {
		t.Fatalf("after the crash: %d messages, want the unacknowledged one again", len(again))
	}
	if err := again[0].Ack(context.Background()); err != nil {
		t.Fatal(err)
	}
	if more := pullN(t, c2, sub, 1, b.AckDeadline+2*time.Second, false); len(more) != 0 {
		t.Fatalf("an acknowledged message came back: %s", more[0].Message().ID)
	}
}

// scripted is an engine that refuses chosen attempts and records the
// order it accepted messages in.
type scripted struct {
	mu       sync.Mutex
	refuse   func(m event.Message, attempt int) bool
	attempts map[string]int
	accepted map[string][]int
	running  map[string]bool
	overlap  string
	release  chan struct{} // when set, Handle waits on it
	started  chan struct{}
}

func (s *scripted) Handle(_ context.Context, d delivery.Delivery) pull.Answer {
	m := d.Message
	id := m.Attributes[event.AttrEventID]
	s.mu.Lock()
	if s.running[m.OrderingKey] {
		s.overlap = m.OrderingKey
	}
	s.running[m.OrderingKey] = true
	s.attempts[id]++
	n := s.attempts[id]
	s.mu.Unlock()
	if s.started != nil {
		s.started <- struct{}{}
	}
	if s.release != nil {
		<-s.release
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.running[m.OrderingKey] = false
	if s.refuse != nil && s.refuse(m, n) {
		return pull.Answer{Status: http.StatusServiceUnavailable, EventID: id, Attempt: n, Code: "scripted"}
	}
	v, _ := strconv.Atoi(m.Attributes["n"])
	s.accepted[m.OrderingKey] = append(s.accepted[m.OrderingKey], v)
	return pull.Answer{Status: http.StatusOK, EventID: id, Attempt: n}
}

func newScripted() *scripted {
	return &scripted{attempts: map[string]int{}, accepted: map[string][]int{}, running: map[string]bool{}}
}

func startWorker(t *testing.T, o pull.Options) (stop func()) {
	t.Helper()
	w, err := pull.New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("worker: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// workerOrder: many keys at once, some messages refused on their first
// attempts; every key is applied in order, one at a time.
func workerOrder(t *testing.T, b Backend) {
	c, topic, sub, _ := setup(t, b)
	const keys, per = 8, 12
	var msgs []event.Message
	for n := 1; n <= per; n++ {
		for k := range keys {
			msgs = append(msgs, message("agg-"+strconv.Itoa(k), n))
		}
	}
	if n, err := c.PublishBatch(context.Background(), topic, msgs); err != nil || n != len(msgs) {
		t.Fatalf("PublishBatch = %d, %v", n, err)
	}
	eng := newScripted()
	eng.refuse = func(m event.Message, attempt int) bool { return m.Attributes["n"] == "3" && attempt < 3 }
	startWorker(t, pull.Options{Source: c, Subscription: sub, Engine: eng, DeadLetters: c, MaxInFlight: 4,
		MaxAttempts: 5, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, ExtendEvery: time.Second})
	eventually.True(t, 30*time.Second, "every message applied", func() bool {
		eng.mu.Lock()
		defer eng.mu.Unlock()
		total := 0
		for _, v := range eng.accepted {
			total += len(v)
		}
		return total == len(msgs)
	})
	eng.mu.Lock()
	defer eng.mu.Unlock()
	if eng.overlap != "" {
		t.Errorf("key %s had two deliveries in flight at once", eng.overlap)
	}
	for k, vs := range eng.accepted {
		for i, v := range vs {
			if v != i+1 {
				t.Fatalf("key %s applied in order %v", k, vs)
			}
		}
	}
}

// workerDeadLetters: a message refused every time goes to <topic>.dlq with
// Pub/Sub's dead-letter attributes after MaxAttempts, and the key's next
// message follows.
func workerDeadLetters(t *testing.T, b Backend) {
	c, topic, sub, dlqSub := setup(t, b)
	if n, err := c.PublishBatch(context.Background(), topic, []event.Message{message("k", 1), message("k", 2)}); err != nil || n != 2 {
		t.Fatalf("PublishBatch = %d, %v", n, err)
	}
	eng := newScripted()
	eng.refuse = func(m event.Message, _ int) bool { return m.Attributes["n"] == "1" }
	startWorker(t, pull.Options{Source: c, Subscription: sub, Engine: eng, DeadLetters: c, Project: "p",
		MaxAttempts: 3, MinBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	dl := pullN(t, c, dlqSub, 1, 20*time.Second, true)
	if len(dl) != 1 {
		t.Fatal("nothing dead-lettered")
	}
	info := deadletter.Read(dl[0].Message())
	if string(dl[0].Message().Data) != "k-1" || info.Subscription != names.ResourceID(sub) || info.Deliveries != 3 {
		t.Errorf("dead letter %q: %+v; want k-1 from %s after 3 deliveries", dl[0].Message().Data, info, sub)
	}
	eventually.True(t, 10*time.Second, "the key's next message applied", func() bool {
		eng.mu.Lock()
		defer eng.mu.Unlock()
		return len(eng.accepted["k"]) == 1 && eng.accepted["k"][0] == 2
	})
	eng.mu.Lock()
	defer eng.mu.Unlock()
	if eng.attempts["k-1"] != 3 {
		t.Errorf("k-1 attempted %d times, want 3", eng.attempts["k-1"])
	}
}

// workerShutdown: a delivery in flight when the worker stops finishes and
// is acknowledged; what was queued behind it is handed back and comes to
// the next worker, and nothing acknowledged comes back.
func workerShutdown(t *testing.T, b Backend) {
	c, topic, sub, _ := setup(t, b)
	if n, err := c.PublishBatch(context.Background(), topic, []event.Message{message("k", 1), message("k", 2), message("k", 3)}); err != nil || n != 3 {
		t.Fatalf("PublishBatch = %d, %v", n, err)
	}
	eng := newScripted()
	eng.release, eng.started = make(chan struct{}), make(chan struct{}, 10)
	stop := startWorker(t, pull.Options{Source: c, Subscription: sub, Engine: eng, DeadLetters: c, ExtendEvery: time.Second})
	<-eng.started // k-1 is being handled
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	close(eng.release) // its transaction commits after shutdown began
	<-stopped

	eng2 := newScripted()
	startWorker(t, pull.Options{Source: c, Subscription: sub, Engine: eng2, DeadLetters: c})
	eng.mu.Lock()
	first := eng.accepted["k"]
	eng.mu.Unlock()
	eventually.True(t, b.AckDeadline+20*time.Second, "the rest delivered to the next worker", func() bool {
		eng2.mu.Lock()
		defer eng2.mu.Unlock()
		return len(first)+len(eng2.accepted["k"]) >= 3
	})
	eng2.mu.Lock()
	defer eng2.mu.Unlock()
	if len(first) == 0 || first[0] != 1 {
		t.Fatalf("first worker applied %v, want k-1 first", first)
	}
	all := append(append([]int{}, first...), eng2.accepted["k"]...)
	for i, v := range all {
		if v != i+1 {
			t.Fatalf("applied %v across the two workers; want 1,2,3 once each", all)
		}
	}
}

// workerLapse: the worker holds a key's messages past their lease (its
// renewals never come: ExtendEvery far beyond the ack deadline, as a
// renewal late on a busy machine), so the broker hands them out again,
// to the same worker. Each message is still applied once, in its key's
// order: a redelivery takes the place of the copy the worker holds.
func workerLapse(t *testing.T, b Backend) {
	c, topic, sub, _ := setup(t, b)
	if n, err := c.PublishBatch(context.Background(), topic, []event.Message{message("k", 1), message("k", 2), message("k", 3)}); err != nil || n != 3 {
		t.Fatalf("PublishBatch = %d, %v", n, err)
	}
	eng := newScripted()
	eng.release, eng.started = make(chan struct{}), make(chan struct{}, 10)
	startWorker(t, pull.Options{Source: c, Subscription: sub, Engine: eng, DeadLetters: c, ExtendEvery: time.Hour})
	<-eng.started                             // k-1 is being handled; k-2 and k-3 wait behind it
	time.Sleep(b.AckDeadline + 3*time.Second) // the leases lapse; the broker delivers them again meanwhile
	close(eng.release)
	eventually.True(t, b.AckDeadline+20*time.Second, "the key's three messages applied", func() bool {
		eng.mu.Lock()
		defer eng.mu.Unlock()
		return len(eng.accepted["k"]) >= 3
	})
	// Anything delivered again would come within a lease of the last.
	time.Sleep(b.AckDeadline + time.Second)
	eng.mu.Lock()
	defer eng.mu.Unlock()
	if got := fmt.Sprint(eng.accepted["k"]); got != "[1 2 3]" {
		t.Fatalf("applied %s; want [1 2 3]: once each, in order", got)
	}
}
