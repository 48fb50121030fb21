package ledger

import (
	"context"
	"errors"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/relaybus/relaybus/internal/cloudevent"
	"github.com/relaybus/relaybus/internal/ledger/consumers"
	"github.com/relaybus/relaybus/internal/ledger/model"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/internal/pubsubtest"
	"github.com/relaybus/relaybus/internal/registry"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/topology"
)

// receiveOne pulls one message from a subscription of the fake; handle
// decides whether it is acknowledged (true) or handed back to Pub/Sub for
// redelivery (false).
func receiveOne(t *testing.T, f *pubsubtest.Fake, sub string, handle func(event.Message) bool) event.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var got *event.Message
	err := f.Client.PubSub().Subscriber(sub).Receive(ctx, func(_ context.Context, m *pubsub.Message) {
		if got != nil {
			m.Nack()
			return
		}
		got = &event.Message{ID: m.ID, Data: m.Data, Attributes: m.Attributes, OrderingKey: m.OrderingKey, PublishTime: m.PublishTime}
		if handle == nil || handle(*got) {
			m.Ack()
		} else {
			m.Nack()
		}
		cancel()
	})
	if got == nil {
		t.Fatalf("nothing on %s: %v", sub, err)
	}
	return *got
}

// The outbox and inbox (Postgres) and the ledger (Firestore) cannot commit
// together; the ledger is written after the fact and converges:
//
//  1. The relay published but its RecordSent failed: the consumers'
//     attempts reach the ledger before the event's document, and rollup
//     creates the document from their notice (no envelope, no send yet).
//  2. One consumer recorded its attempt but crashed before its notice: no
//     notice will ever name it.
//  3. The relay's healing step records the send later: the document gets
//     a checkAt, and the reconciler (no notice needed) derives CONSUMED.
//  4. The relay publishes again (it crashed before settling) and records
//     the send again: the CONSUMED document is left as it is.
//
// Real parts: Postgres (outbox.Enqueue), pstest (the event and the rollup
// notice), the Firestore emulator; the clock is moved for the reconciler.
func TestCrashBetweenOutboxAndLedgerHeals(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Schema(t)
	if err := outbox.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	top, err := topology.Load("../../infra/topology.yaml")
	if err != nil {
		t.Fatal(err)
	}
	clock := &testClock{t: time.Now().UTC()}
	s := newStore(t, Options{Now: clock.now})
	if _, err := s.SyncConsumers(ctx, registry.Consumers(top), consumers.SyncOptions{}); err != nil {
		t.Fatal(err)
	}
	ps := pubsubtest.New(t)
	ps.Provision(t, top)
	rec := NewRecorder(ps.Client, RecorderOptions{Topic: top.Rollup.Topic, Levels: model.LevelsOf(top)})
	rollupSub := "relaybus.ledger.rollup.rollup-processor"

	// The producer's transaction writes the outbox row.
	e := &event.Event{Type: "order.purchased", Topic: orderTopic, AggregateID: "ORD-7", Version: 1,
		Payload: []byte(`{"orderId":"ORD-7"}`), Initiator: event.Initiator{Service: "order-service"}}
	if _, err := outbox.Enqueue(ctx, pool, e); err != nil {
		t.Fatal(err)
	}

	// 1. The relay publishes; its ledger write fails (Firestore
	// unreachable: here a cancelled call).
	msg, err := cloudevent.Encode(e, event.EncodingJSON)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ps.Client.Publish(ctx, orderTopic, msg); err != nil {
		t.Fatal(err)
	}
	dead, cancel := context.WithCancel(ctx)
	cancel()
	if err := s.RecordSent(dead, model.SentAt(clock.t, e)); err == nil {
		t.Fatal("RecordSent on a dead connection succeeded")
	}

	// Both consumers handle it; member-service's attempt and notice reach
	// the ledger, message-service's attempt does but its notice never does.
	for _, c := range []string{"member-service", "message-service"} {
		got, _, err := cloudevent.Decode(receiveOne(t, ps, orderTopic+"."+c+"-processor", nil), event.Limits{})
		if err != nil || got.ID != e.ID {
			t.Fatalf("consumer %s decoded %q: %v", c, got.ID, err)
		}
	}
	if err := rec.RecordAttempts(ctx, []model.Attempt{attempt(e, "member-service", 1, model.OutcomeSuccess)}); err != nil {
		t.Fatal(err)
	}
	if err := s.InsertAttempts(ctx, []model.Attempt{attempt(e, "message-service", 1, model.OutcomeSuccess)}); err != nil {
		t.Fatal(err)
	}
	notice := receiveOne(t, ps, rollupSub, nil)
	ns, err := model.ReadNotice(notice)
	if err != nil || len(ns) != 1 || ns[0].EventID != e.ID {
		t.Fatalf("notice names %v: %v", ns, err)
	}
	if rs, err := s.Fold(ctx, ns, 0); err != nil || rs[0].Err != nil || !rs[0].Changed || rs[0].Status != model.StatusSent || rs[0].Reported != 1 {
		t.Fatalf("rollup before the send was recorded: %+v %v, want the document created, SENT, 1 reported", rs, err)
	}
	if d := mustGet(t, s, e.ID); d.Event.EventType != "" || !d.Event.SentAt.IsZero() || d.Event.Status != model.StatusSent {
		t.Fatalf("the document the rollup created: type %q sentAt %v %s, want no envelope, no send, SENT", d.Event.EventType, d.Event.SentAt, d.Event.Status)
	}

	// 3. The healing step records the send; no notice comes any more. Before
	// checkAt the reconciler leaves it; after, it derives CONSUMED.
	if err := s.RecordSent(ctx, model.SentAt(clock.t, e)); err != nil {
		t.Fatal(err)
	}
	if d := mustGet(t, s, e.ID); d.Event.Status != model.StatusSent || d.Event.EventType != e.Type || d.Event.AggregateID != e.AggregateID ||
		!d.Event.SentAt.Equal(clock.t.Truncate(time.Microsecond)) {
		t.Fatalf("after the send: %s type %q aggregate %q sentAt %v", d.Event.Status, d.Event.EventType, d.Event.AggregateID, d.Event.SentAt)
	}
	// The notice redelivered (or a duplicate) folds nothing new.
	if rs, err := s.Fold(ctx, ns, 0); err != nil || rs[0].Err != nil || rs[0].Changed || rs[0].Status != model.StatusSent || rs[0].Reported != 1 {
		t.Fatalf("the notice redelivered: %+v %v", rs, err)
	}
	if rep, err := s.Reconcile(ctx, 0); err != nil || rep.Due != 0 {
		t.Fatalf("reconcile before checkAt: %+v %v", rep, err)
	}
	clock.t = clock.t.Add(DefaultReconcileAfter + time.Second)
	rep, err := s.Reconcile(ctx, 0)
	if err != nil || rep.Due != 1 || rep.Changed != 1 || rep.Settled != 1 {
		t.Fatalf("reconcile after checkAt: %+v %v", rep, err)
	}
	d := mustGet(t, s, e.ID)
	if d.Event.Status != model.StatusConsumed || d.Summary() != "2/2 consumed" {
		t.Errorf("after reconciling: %s %s", d.Event.Status, d.Summary())
	}
	if rep, err := s.Reconcile(ctx, 0); err != nil || rep.Due != 0 {
		t.Errorf("a settled event is still due for the reconciler: %+v %v", rep, err)
	}

	// 4. A replayed send leaves the CONSUMED document as it is.
	before := d.Event
	if err := s.RecordSent(ctx, model.SentAt(clock.t.Add(time.Minute), e)); err != nil {
		t.Fatal(err)
	}
	after := mustGet(t, s, e.ID).Event
	if after.Status != model.StatusConsumed || !after.UpdatedAt.Equal(before.UpdatedAt) || !after.SentAt.Equal(before.SentAt) {
		t.Errorf("replayed send changed the ledger: %+v", after)
	}
}

// An event whose consumers never report stays SENT: the reconciler looks
// at it again later and later (never more than hourly), and writes nothing
// but its next look.
func TestReconcilerBacksOffOnEventsThatWait(t *testing.T) {
	ctx := context.Background()
	clock := &testClock{t: time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)}
	s := newStore(t, Options{Now: clock.now})
	seed(t, s, orderTopic, "member-service")
	e := newEventOn(t, orderTopic, "order.purchased", clock.t)
	if err := s.RecordSent(ctx, model.SentAt(clock.t, e)); err != nil {
		t.Fatal(err)
	}
	var looks []time.Duration
	start := clock.t
	for clock.t.Sub(start) < 6*time.Hour {
		clock.t = clock.t.Add(time.Minute)
		rep, err := s.Reconcile(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Due > 0 {
			looks = append(looks, clock.t.Sub(start))
			if rep.Changed != 0 {
				t.Fatalf("an event nobody reported on changed: %+v", rep)
			}
		}
	}
	if n := len(looks); n < 5 || n > 12 {
		t.Fatalf("looked %d times in 6 hours (%v); want a handful, spaced out", n, looks)
	}
	for i := 1; i < len(looks); i++ {
		if gap := looks[i] - looks[i-1]; gap > time.Hour+time.Minute {
			t.Errorf("looks %v and %v are %v apart, over an hour", looks[i-1], looks[i], gap)
		}
	}
	if d := mustGet(t, s, e.ID); d.Event.Status != model.StatusSent {
		t.Errorf("status %s", d.Event.Status)
	}
}

// The reconciler's look at a batch of due events costs one query (its
// index), not one per event: it reads the attempts after each event's
// marks by id, in one request. A query per event cost the Firestore
// emulator a scan of every document it held, and made a local stack that
// fell behind fall further behind. It still finds what the consumers
// reported as documents.
func TestReconcilerSendsOneQueryPerBatch(t *testing.T) {
	ctx := context.Background()
	clock := &testClock{t: time.Now().UTC()}
	s, c := newCountedStore(t, Options{Now: clock.now, ReconcileAfter: time.Minute})
	seed(t, s, orderTopic, "billing", "shipping")
	const n = 30
	var events []*event.Event
	for range n {
		events = append(events, newEventOn(t, orderTopic, "order.purchased", clock.t))
	}
	if err := s.RecordSent(ctx, model.SentAt(clock.t, events...)); err != nil {
		t.Fatal(err)
	}
	// Every other event: billing's first attempt failed and its notice is
	// late, so only its document tells.
	var failed []model.Attempt
	for i := 0; i < n; i += 2 {
		failed = append(failed, attempt(events[i], "billing", 1, model.OutcomeRetry))
	}
	if err := s.InsertAttempts(ctx, failed); err != nil {
		t.Fatal(err)
	}
	clock.t = clock.t.Add(2 * time.Minute)
	q0 := c.Queries()
	rep, err := s.Reconcile(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if q := c.Queries() - q0; q != 1 {
		t.Errorf("the reconciler's look at %d due events sent %d queries, want 1 (its index)", rep.Due, q)
	}
	if rep.Due != n || rep.Changed != n/2 {
		t.Errorf("reconcile: %+v, want %d due and %d changed", rep, n, n/2)
	}
	for i, e := range events {
		want := model.StatusSent
		if i%2 == 0 {
			want = model.StatusRetrying
		}
		if got := mustGet(t, s, e.ID).Event.Status; got != want {
			t.Errorf("event %d: %s, want %s", i, got, want)
		}
	}
}

// After a crash the consumers' attempts can reach the ledger as documents
// before the send does, with notices of the former shape (event ids
// alone), which cannot create the event's document: the late send leaves
// them to the reconciler, which the send makes due at once (checkAt is the
// send's time + ReconcileAfter), instead of reading every attempt on the
// relay's path.
func TestLateSendFindsItsAttempts(t *testing.T) {
	ctx := context.Background()
	clock := &testClock{t: time.Now().UTC()}
	s := newStore(t, Options{Now: clock.now})
	seed(t, s, orderTopic, "billing", "shipping")
	sentAt := clock.t.Add(-time.Minute)
	e := newEventOn(t, orderTopic, "order.purchased", sentAt)
	if err := s.InsertAttempts(ctx, []model.Attempt{attempt(e, "billing", 1, model.OutcomeSuccess), attempt(e, "shipping", 1, model.OutcomeSuccess)}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Rollup(ctx, e.ID); !errors.Is(err, model.ErrEventNotFound) {
		t.Fatalf("rollup before the send: %v, want ErrEventNotFound", err)
	}
	if err := s.RecordSent(ctx, model.SentAt(sentAt, e)); err != nil {
		t.Fatal(err)
	}
	clock.t = clock.t.Add(time.Second)
	if rep, err := s.Reconcile(ctx, 0); err != nil || rep.Due != 1 || rep.Settled != 1 {
		t.Fatalf("reconcile after the late send: %+v %v", rep, err)
	}
	if d := mustGet(t, s, e.ID); d.Event.Status != model.StatusConsumed {
		t.Fatalf("after the late send: %s, want CONSUMED", d.Event.Status)
	}
}
