package ledger

import (
	"context"
	"errors"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/internal/pubsubtest"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/registry"
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

// The outbox (Postgres) and the ledger (Firestore) cannot commit together.
// Each crash between them heals by replaying the same calls, which rewrite
// the same documents:
//
//  1. The relay published but its RecordSent failed: consumers' attempts
//     arrive before the event document; rollup refuses their notices
//     (ErrEventNotFound, non-2xx), the next relay run records the send, and
//     the redelivered notice rolls the event up.
//  2. consume recorded an attempt but its notice was not published: the
//     redelivery records the same attempt (no-op) and publishes the notice.
//  3. The relay recorded the send and published but crashed before marking
//     the row: it publishes again and RecordSent leaves the (by now
//     CONSUMED) document alone.
//
// Real parts: Postgres (outbox.Enqueue), pstest (the event and the rollup
// notices), the Firestore emulator. The relay is driven by the calls it
// makes (RecordSent before publishing, publish regardless of the ledger).
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
	s := newStore(t, Options{})
	if _, err := s.SyncConsumers(ctx, registry.Consumers(top), SyncOptions{}); err != nil {
		t.Fatal(err)
	}
	ps := pubsubtest.New(t)
	ps.Provision(t, top)
	rec := NewRecorder(s, ps.Client, top.Rollup.Topic)
	rollupSub := "relaybus.ledger.rollup.rollup-processor"

	// The producer's transaction writes the outbox row.
	e := &event.Event{Type: "order.purchased", Topic: orderTopic, AggregateID: "ORD-7", Version: 1,
		Payload: []byte(`{"orderId":"ORD-7"}`), Initiator: event.Initiator{Service: "order-service"}}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Enqueue(ctx, tx, e); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	// 1. Relay run 1: the ledger write fails (Firestore unreachable: here a
	// cancelled call), the relay publishes anyway.
	dead, cancel := context.WithCancel(ctx)
	cancel()
	if err := s.RecordSent(dead, []*event.Event{e}, time.Now()); err == nil {
		t.Fatal("RecordSent on a dead connection succeeded")
	}
	msg, err := event.Encode(e, event.EncodingJSON)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ps.Client.Publish(ctx, orderTopic, msg); err != nil {
		t.Fatal(err)
	}
	if st, _ := outbox.Lookup(ctx, pool, e.ID); st[e.ID].State != outbox.StatePending {
		t.Fatalf("outbox row %+v", st[e.ID])
	}

	// Both consumers handle it and record their attempts.
	for n, c := range []string{"member-service", "message-service"} {
		sub := receiveOne(t, ps, orderTopic+"."+c+"-processor", nil)
		got, _, err := event.Decode(sub, event.Limits{})
		if err != nil || got.ID != e.ID {
			t.Fatalf("consumer %s decoded %q: %v", c, got.ID, err)
		}
		if n == 1 {
			// 2. message-service recorded its attempt, then crashed before
			// the notice: only the attempt document exists.
			if _, err := s.InsertAttempt(ctx, attempt(e, c, 1, OutcomeSuccess)); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := rec.RecordAttempt(ctx, attempt(e, c, 1, OutcomeSuccess)); err != nil {
			t.Fatal(err)
		}
	}
	// The rollup function's part: roll the notice's event up; refuse
	// (non-2xx, so Pub/Sub redelivers) when the event is not there yet.
	var rollupErrs []error
	rollup := func(m event.Message) bool {
		id, err := RollupEventID(m)
		if err != nil {
			t.Fatal(err)
		}
		_, err = s.Rollup(ctx, id)
		rollupErrs = append(rollupErrs, err)
		return err == nil
	}
	receiveOne(t, ps, rollupSub, rollup)
	if len(rollupErrs) != 1 || !errors.Is(rollupErrs[0], ErrEventNotFound) {
		t.Fatalf("rollup before the send was recorded: %v, want ErrEventNotFound", rollupErrs)
	}

	// Relay run 2 records the send it owes the ledger.
	if err := s.RecordSent(ctx, []*event.Event{e}, time.Now()); err != nil {
		t.Fatal(err)
	}
	// message-service's redelivery: the inbox says duplicate, consume
	// records the same attempt again and publishes the notice this time.
	if err := rec.RecordAttempt(ctx, attempt(e, "message-service", 1, OutcomeSuccess)); err != nil {
		t.Fatal(err)
	}
	// The refused notice comes back, with message-service's: both succeed.
	rollupErrs = nil
	receiveOne(t, ps, rollupSub, rollup)
	receiveOne(t, ps, rollupSub, rollup)
	if len(rollupErrs) != 2 || rollupErrs[0] != nil || rollupErrs[1] != nil {
		t.Fatalf("rollups after healing: %v", rollupErrs)
	}
	d := mustGet(t, s, e.ID)
	if d.Event.Status != StatusConsumed || d.Summary() != "2/2 consumed" || len(d.Consumers[1].Attempts) != 1 {
		t.Errorf("after healing: %s %s, message-service attempts %+v", d.Event.Status, d.Summary(), d.Consumers[1].Attempts)
	}

	// 3. The relay publishes again (it crashed before marking the row) and
	// records the send again: the CONSUMED document is left as it is.
	before := d.Event
	if err := s.RecordSent(ctx, []*event.Event{e}, time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	after := mustGet(t, s, e.ID).Event
	if after.Status != StatusConsumed || !after.UpdatedAt.Equal(before.UpdatedAt) || !after.SentAt.Equal(before.SentAt) {
		t.Errorf("replayed send changed the ledger: %+v", after)
	}
}
