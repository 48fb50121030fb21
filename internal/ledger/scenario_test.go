package ledger

import (
	"context"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/relaybus/relaybus/internal/ledger/consumers"
	"github.com/relaybus/relaybus/internal/ledger/model"
	"github.com/relaybus/relaybus/internal/ledger/query"
	"github.com/relaybus/relaybus/internal/pubsubtest"
	"github.com/relaybus/relaybus/internal/registry"
	"github.com/relaybus/relaybus/shared/broker"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/topology"
)

// notices receives the rollup notices consume publishes, as the rollup
// function's subscription would.
type notices struct {
	ch chan event.Message
}

func receiveNotices(t *testing.T, f *pubsubtest.Fake, top *topology.Topology) *notices {
	t.Helper()
	n := &notices{ch: make(chan event.Message, 1000)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		_ = f.Client.PubSub().Subscriber(broker.RollupSubscription(top)).Receive(ctx, func(_ context.Context, m *pubsub.Message) {
			n.ch <- event.Message{ID: m.ID, Data: m.Data, Attributes: m.Attributes, PublishTime: m.PublishTime, OrderingKey: m.OrderingKey}
			m.Ack()
		})
	}()
	return n
}

func (n *notices) next(t *testing.T) event.Message {
	t.Helper()
	select {
	case m := <-n.ch:
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("no rollup notice within 10s")
		return event.Message{}
	}
}

// The demo's purchase scenario: order.purchased with two consumers, member-service
// and message-service; message-service fails once and then succeeds; each
// emits a child event. Real parts: the Firestore emulator, Pub/Sub (pstest)
// for the rollup notices, the repository's topology.
func TestPurchaseScenario(t *testing.T) {
	ctx := context.Background()
	top, err := topology.Load("../../infra/topology.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s := newStore(t, Options{})
	if _, err := s.SyncConsumers(ctx, registry.Consumers(top), consumers.SyncOptions{DisableUnlisted: true}); err != nil {
		t.Fatal(err)
	}
	ps := pubsubtest.New(t)
	ps.Provision(t, top)
	rec := NewRecorder(ps.Client, RecorderOptions{Topic: top.Rollup.Topic, Levels: model.LevelsOf(top)})
	inbox := receiveNotices(t, ps, top)

	t0 := time.Date(2024, 2, 28, 10, 5, 0, 0, time.UTC)
	purchase := &event.Event{
		Type: "order.purchased", Topic: "shop.order.events", AggregateID: "ORD-2024-002", Version: 1, OccurredAt: t0,
		Payload:   []byte(`{"orderId":"ORD-2024-002","userId":"user-A","amount":199.00,"currency":"CNY","channel":"app"}`),
		Initiator: event.Initiator{Service: "order-service", Operation: "confirmOrder", UserID: "user-A", ClientRequestID: "req-abc-002"},
		TraceID:   "trace-001", SpanID: "span-001",
	}
	if err := purchase.Prepare(t0, event.Limits{}); err != nil {
		t.Fatal(err)
	}
	if err := s.RecordSent(ctx, model.SentAt(t0.Add(time.Second), purchase)); err != nil {
		t.Fatal(err)
	}
	statuses := []model.Status{mustGet(t, s, purchase.ID).Event.Status}

	// consume records each attempt and publishes a notice; rollup (the
	// function's store call) derives the status from the notice's event.
	record := func(a model.Attempt) RollupResult {
		t.Helper()
		if err := rec.RecordAttempts(ctx, []model.Attempt{a}); err != nil {
			t.Fatal(err)
		}
		ns, err := model.ReadNotice(inbox.next(t))
		if err != nil || len(ns) != 1 || ns[0].EventID != a.EventID || len(ns[0].Attempts) != 1 {
			t.Fatalf("notice %+v (%v), want %s with its attempt", ns, err, a.EventID)
		}
		rs, err := s.Fold(ctx, ns, 0)
		if err != nil || rs[0].Err != nil {
			t.Fatal(err, rs[0].Err)
		}
		res := rs[0]
		if res.Changed {
			statuses = append(statuses, res.Status)
		}
		return res
	}
	member := attempt(purchase, "member-service", 1, model.OutcomeSuccess)
	member.ConsumedAt = t0.Add(2 * time.Second)
	if res := record(member); res.Status != model.StatusSent || res.Changed || res.Reported != 1 {
		t.Errorf("after member-service: %+v (one of two reported: still SENT, nothing written)", res)
	}
	msgFail := attempt(purchase, "message-service", 1, model.OutcomeRetry)
	msgFail.ConsumedAt, msgFail.ErrorCode, msgFail.ErrorMessage = t0.Add(3*time.Second), "smtp_timeout", "smtp: i/o timeout"
	if res := record(msgFail); res.Status != model.StatusPartial {
		t.Errorf("after message-service failed: %s, want PARTIAL", res.Status)
	}
	msgOK := attempt(purchase, "message-service", 2, model.OutcomeSuccess)
	msgOK.ConsumedAt = t0.Add(10 * time.Second)
	if res := record(msgOK); res.Status != model.StatusConsumed || res.Succeeded != 2 {
		t.Errorf("after message-service succeeded: %+v", res)
	}
	if got := joinStatuses(statuses); got != "SENT,PARTIAL,CONSUMED" {
		t.Errorf("status went %s, want SENT,PARTIAL,CONSUMED", got)
	}

	// Both consumers' histories are complete.
	d := mustGet(t, s, purchase.ID)
	if d.Summary() != "2/2 consumed" || len(d.Consumers) != 2 {
		t.Fatalf("detail %s %+v", d.Summary(), d.Consumers)
	}
	m, n := d.Consumers[0], d.Consumers[1]
	if m.ConsumerID != "member-service" || m.State != model.ConsumerSucceeded || len(m.Attempts) != 1 || !m.Attempts[0].Success {
		t.Errorf("member-service history %+v", m)
	}
	if n.ConsumerID != "message-service" || n.State != model.ConsumerSucceeded || len(n.Attempts) != 2 ||
		n.Attempts[0].Success || n.Attempts[0].ErrorCode != "smtp_timeout" || n.Attempts[0].ErrorMessage != "smtp: i/o timeout" ||
		!n.Attempts[0].ConsumedAt.Equal(msgFail.ConsumedAt) || !n.Attempts[1].Success || n.Attempts[1].AttemptNo != 2 {
		t.Errorf("message-service history %+v", n)
	}

	// Each consumer emits a child event in the same trace.
	child := func(typ, topic, agg string, at time.Time) *event.Event {
		e := &event.Event{Type: typ, Topic: topic, AggregateID: agg, Version: 1, OccurredAt: at, Payload: []byte(`{"userId":"user-A"}`),
			TraceID: purchase.TraceID, SpanID: event.NewSpanID(), ParentEventID: purchase.ID,
			Initiator: event.Initiator{Service: strings.SplitN(topic, ".", 2)[0] + "-service"}}
		if err := e.Prepare(at, event.Limits{}); err != nil {
			t.Fatal(err)
		}
		return e
	}
	notified := child("notification.sent", "message.notification.events", "user-A", t0.Add(11*time.Second))
	points := child("points.added", "member.points.events", "user-A", t0.Add(2*time.Second))
	if err := s.RecordSent(ctx, model.SentAt(t0.Add(12*time.Second), notified, points)); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{purchase.ID, points.ID, notified.ID} {
		tr, err := s.Trace(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if tr.TraceID != "trace-001" || tr.Count != 3 || len(tr.Roots) != 1 {
			t.Fatalf("trace from %s: %+v", id, tr)
		}
		root := tr.Roots[0]
		if root.Event.EventID != purchase.ID || len(root.Children) != 2 ||
			root.Children[0].Event.EventType != "points.added" || root.Children[1].Event.EventType != "notification.sent" {
			t.Errorf("trace tree from %s: root %s children %v", id, root.Event.EventType, types(root.Children))
		}
		if root.Event.Payload != nil {
			t.Error("trace read payloads")
		}
	}
}

func joinStatuses(ss []model.Status) string {
	var out []string
	for _, s := range ss {
		out = append(out, string(s))
	}
	return strings.Join(out, ",")
}

func types(ns []*query.TraceNode) []string {
	var out []string
	for _, n := range ns {
		out = append(out, n.Event.EventType)
	}
	return out
}
