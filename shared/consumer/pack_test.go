package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relaybus/relaybus/internal/cloudevent"
	"github.com/relaybus/relaybus/internal/delivery"
	"github.com/relaybus/relaybus/internal/pack"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/relaybustest"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/projection"
	"github.com/relaybus/relaybus/shared/topology"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const packTopic = "shop.order.events"

// appliedTable records each event a handler applies, with the
// transaction that applied it.
func appliedTable(ctx context.Context, db *pgxpool.Pool) error {
	_, err := db.Exec(ctx, `CREATE TABLE applied (n bigserial PRIMARY KEY, event_id text NOT NULL, xact bigint NOT NULL DEFAULT txid_current())`)
	return err
}

// applier records each event it handles, failing (transiently) the
// deliveries fail names, each as many times as it says.
type applier struct {
	mu   sync.Mutex
	fail map[string]int
}

func (a *applier) Handle(ctx context.Context, c *consumer.Context) error {
	a.mu.Lock()
	n := a.fail[c.Event.ID]
	if n > 0 {
		a.fail[c.Event.ID] = n - 1
	}
	a.mu.Unlock()
	if n > 0 {
		return consumer.Transient("test", errors.New("the test fails "+c.Event.ID))
	}
	_, err := c.Tx.Exec(ctx, `INSERT INTO applied (event_id) VALUES ($1)`, c.Event.ID)
	return err
}

type applied struct {
	ids   []string
	xacts map[int64]bool
}

func appliedOf(t *testing.T, db *pgxpool.Pool) applied {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT event_id, xact FROM applied ORDER BY n`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := applied{xacts: map[int64]bool{}}
	for rows.Next() {
		var id string
		var x int64
		if err := rows.Scan(&id, &x); err != nil {
			t.Fatal(err)
		}
		out.ids, out.xacts[x] = append(out.ids, id), true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// appliedInOneTransaction fails t unless the events applied are want, in
// order, all in one transaction (the pack's).
func appliedInOneTransaction(t *testing.T, db *pgxpool.Pool, want []string) {
	t.Helper()
	got := appliedOf(t, db)
	if !slices.Equal(got.ids, want) {
		t.Fatalf("applied %v, want %v", got.ids, want)
	}
	if len(got.xacts) != 1 {
		t.Errorf("the events were applied in %d transactions, want the pack's one", len(got.xacts))
	}
}

// packOf is the pack a relay sends for versions from..to of aggregate agg,
// addressed to consumer, at delivery attempt n.
func packOf(t *testing.T, consumerID, agg string, from, to int64, n int) event.Message {
	t.Helper()
	var msgs []event.Message
	for v := from; v <= to; v++ {
		e := relaybustest.NewEvent(packTopic, "order.purchased", agg, v, map[string]any{"v": v})
		e.ID = fmt.Sprintf("%s-v%d", agg, v)
		m, err := cloudevent.Encode(e, event.EncodingJSON)
		if err != nil {
			t.Fatal(err)
		}
		m.Attributes[topology.TargetConsumerAttr] = consumerID
		msgs = append(msgs, m)
	}
	p, err := pack.Encode(msgs)
	if err != nil {
		t.Fatal(err)
	}
	p.ID, p.Topic, p.DeliveryAttempt, p.PublishTime = fmt.Sprintf("m-%s-%d", agg, from), packTopic, n, time.Now()
	return p
}

func deliver(k *relaybustest.Kit, m event.Message) consumer.Result {
	return k.Engine.Handle(context.Background(), delivery.Delivery{Mode: delivery.ModePush,
		Subscription: packTopic + "." + relaybustest.DefaultConsumerID + "-sub", Message: m})
}

func ids(agg string, vs ...int64) []string {
	var out []string
	for _, v := range vs {
		out = append(out, fmt.Sprintf("%s-v%d", agg, v))
	}
	return out
}

// A pack's events are applied in order, in one transaction, each
// recorded in the inbox: delivered again, all of them are duplicates.
func TestAPackIsAppliedInOrderInOneTransaction(t *testing.T) {
	k := relaybustest.New(t, &applier{}, relaybustest.Options{Migrate: appliedTable})
	r := deliver(k, packOf(t, relaybustest.DefaultConsumerID, "order-a", 1, 50, 1))
	if r.Status != 200 || r.Packed != 50 || r.Duplicate {
		t.Fatalf("pack: %+v, want 200 with its 50 events applied", r)
	}
	appliedInOneTransaction(t, k.DB, ids("order-a", seq(1, 50)...))
	var attempts int
	if err := k.DB.QueryRow(context.Background(), `SELECT count(*) FROM relaybus_attempts WHERE outcome = 'success'`).Scan(&attempts); err != nil || attempts != 50 {
		t.Errorf("recorded %d successful attempts (%v), want 50", attempts, err)
	}
	again := deliver(k, packOf(t, relaybustest.DefaultConsumerID, "order-a", 1, 50, 2))
	if again.Status != 200 || !again.Duplicate {
		t.Errorf("the pack delivered again: %+v, want 200 and duplicate", again)
	}
	if n := len(appliedOf(t, k.DB).ids); n != 50 {
		t.Errorf("%d events applied after the redelivery, want 50", n)
	}
}

// An event of a pack that fails transiently stops the pack: the events
// before it stay applied, the answer asks for a redelivery, and the
// redelivery applies the rest, each event once and in order. (The failure
// is met twice in the first delivery: in the pack's transaction, which
// rolls back, and again when the events are handled one at a time, where
// it is recorded.)
func TestAPackStopsAtAFailedEventAndResumesOnRedelivery(t *testing.T) {
	h := &applier{fail: map[string]int{"order-a-v3": 2}}
	k := relaybustest.New(t, h, relaybustest.Options{Migrate: appliedTable})
	r := deliver(k, packOf(t, relaybustest.DefaultConsumerID, "order-a", 1, 5, 1))
	if r.Status != 503 || r.EventID != "order-a-v3" || r.Packed != 5 {
		t.Fatalf("pack with v3 failing: %+v, want 503 naming order-a-v3", r)
	}
	if got := appliedOf(t, k.DB).ids; !slices.Equal(got, ids("order-a", 1, 2)) {
		t.Fatalf("applied %v before the redelivery, want v1 and v2", got)
	}
	r = deliver(k, packOf(t, relaybustest.DefaultConsumerID, "order-a", 1, 5, 2))
	if r.Status != 200 {
		t.Fatalf("redelivery: %+v, want 200", r)
	}
	if got := appliedOf(t, k.DB).ids; !slices.Equal(got, ids("order-a", seq(1, 5)...)) {
		t.Fatalf("applied %v, want v1..v5 once each, in order", got)
	}
	var failed int
	if err := k.DB.QueryRow(context.Background(), `SELECT count(*) FROM relaybus_attempts WHERE event_id = 'order-a-v3' AND outcome = 'retry'`).Scan(&failed); err != nil || failed != 1 {
		t.Errorf("order-a-v3 has %d retry attempts recorded (%v), want 1", failed, err)
	}
}

// At the pack's last delivery attempt, an event that still fails is
// dead-lettered alone and the rest of the pack is applied: the broker
// would otherwise dead-letter the whole pack.
func TestAPackAtItsLastAttemptDeadLettersTheFailedEventAlone(t *testing.T) {
	h := &applier{fail: map[string]int{"order-a-v3": 10}}
	k := relaybustest.New(t, h, relaybustest.Options{Migrate: appliedTable, MaxDeliveryAttempts: 2})
	if r := deliver(k, packOf(t, relaybustest.DefaultConsumerID, "order-a", 1, 5, 1)); r.Status != 503 {
		t.Fatalf("first delivery: %+v, want 503", r)
	}
	r := deliver(k, packOf(t, relaybustest.DefaultConsumerID, "order-a", 1, 5, 2))
	if r.Status != 200 {
		t.Fatalf("last delivery: %+v, want 200", r)
	}
	if got := appliedOf(t, k.DB).ids; !slices.Equal(got, ids("order-a", 1, 2, 4, 5)) {
		t.Errorf("applied %v, want every event but v3", got)
	}
	dls := k.DeadLetters()
	if len(dls) != 1 || dls[0].Message.Attributes[event.AttrEventID] != "order-a-v3" || pack.Is(dls[0].Message) || dls[0].Topic != packTopic+".dlq" {
		t.Errorf("dead letters %+v, want order-a-v3 alone on %s.dlq", dls, packTopic)
	}
}

// A pack addressed to another consumer is ignored; a pack that cannot be
// read is poison, dead-lettered whole with a reason naming what is wrong.
func TestAPackForAnotherConsumerOrMalformed(t *testing.T) {
	k := relaybustest.New(t, &applier{}, relaybustest.Options{Migrate: appliedTable})
	if r := deliver(k, packOf(t, "someone-else", "order-a", 1, 3, 1)); r.Status != 200 || !r.Ignored {
		t.Errorf("a pack for someone-else: %+v, want 200 ignored", r)
	}
	bad := packOf(t, relaybustest.DefaultConsumerID, "order-a", 1, 3, 1)
	bad.Attributes[pack.Attr] = "4"
	r := deliver(k, bad)
	if r.Status != 200 || r.Code != event.ReasonMalformed {
		t.Errorf("a pack whose count disagrees with its data: %+v, want 200 poison malformed", r)
	}
	if dls := k.DeadLetters(); len(dls) != 1 || !pack.Is(dls[0].Message) {
		t.Errorf("dead letters %+v, want the malformed pack", dls)
	}
	if n := len(appliedOf(t, k.DB).ids); n != 0 {
		t.Errorf("%d events applied, want none", n)
	}
}

func seq(from, to int64) []int64 {
	var out []int64
	for v := from; v <= to; v++ {
		out = append(out, v)
	}
	return out
}

// A strict handler in a pack: a version parked before the pack arrived is
// applied when its predecessor in the pack is, and the pack's later
// versions follow it, each once and in order, all in the pack's
// transaction (the position is locked once and carried from event to
// event, and must account for what the drain applied).
func TestAPackThroughAStrictHandlerDrainsWhatWasParked(t *testing.T) {
	k := relaybustest.New(t, projection.Strict(&applier{}), relaybustest.Options{Migrate: appliedTable})
	early := packOf(t, relaybustest.DefaultConsumerID, "order-a", 3, 3, 1)
	inner, err := pack.Decode(early)
	if err != nil {
		t.Fatal(err)
	}
	if r := deliver(k, inner[0]); r.Status != 200 || r.Outcome != "parked" {
		t.Fatalf("v3 before v1 and v2: %+v, want parked", r)
	}
	if r := deliver(k, packOf(t, relaybustest.DefaultConsumerID, "order-a", 1, 6, 1)); r.Status != 200 {
		t.Fatalf("pack v1..v6: %+v, want 200", r)
	}
	appliedInOneTransaction(t, k.DB, ids("order-a", seq(1, 6)...))
}

// slow applies each event after a pause: a handler slower than the pack's
// time budget allows for the whole pack.
type slow struct {
	applier
	each time.Duration
}

func (s *slow) Handle(ctx context.Context, c *consumer.Context) error {
	select {
	case <-time.After(s.each):
	case <-ctx.Done():
		return ctx.Err()
	}
	return s.applier.Handle(ctx, c)
}

type noDeadLetters struct{}

func (noDeadLetters) Publish(context.Context, string, event.Message) (string, error) {
	return "", errors.New("the test dead-letters nothing")
}

// A pack whose events take longer together than the engine's Timeout is
// answered 503 pack_unfinished once its time runs out, with the events
// handled so far applied; each redelivery goes on from there, and the
// pack's last delivery attempt handles whatever is left, so every event is
// applied once, in order, within the broker's attempts.
func TestAPackSlowerThanItsTimeGoesOnAtEachRedelivery(t *testing.T) {
	h := &slow{each: 40 * time.Millisecond}
	k := relaybustest.New(t, h, relaybustest.Options{Migrate: appliedTable})
	eng, err := consumer.New(consumer.Options{DB: k.DB, ConsumerID: relaybustest.DefaultConsumerID, Handler: h,
		DeadLetters: noDeadLetters{}, Timeout: 300 * time.Millisecond, MaxDeliveryAttempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	unfinished, progress := 0, 0
	for n := 1; ; n++ {
		r := eng.Handle(context.Background(), delivery.Delivery{Mode: delivery.ModePush,
			Subscription: packTopic + "." + relaybustest.DefaultConsumerID + "-sub", Message: packOf(t, relaybustest.DefaultConsumerID, "order-a", 1, 8, n)})
		if r.Status == 200 {
			break
		}
		if r.Code != consumer.CodePackUnfinished || n == 3 {
			t.Fatalf("delivery %d: %+v, want 503 pack_unfinished before the last attempt", n, r)
		}
		unfinished++
		applied := len(appliedOf(t, k.DB).ids)
		if applied <= progress {
			t.Fatalf("delivery %d left %d events applied, %d before it: a redelivery must go on", n, applied, progress)
		}
		progress = applied
	}
	if unfinished == 0 {
		t.Errorf("8 events of 40 ms each within a 300 ms budget finished in one delivery")
	}
	if got := appliedOf(t, k.DB).ids; !slices.Equal(got, ids("order-a", seq(1, 8)...)) {
		t.Errorf("applied %v, want v1..v8 once each, in order", got)
	}
}

// Two versions of one change side by side (event.SideBySide) in one pack,
// to a consumer that reads both: the change is applied once, from the
// first version in the pack, exactly as when each is delivered alone (the
// second sees the first applied; claiming both before either handler ran
// would have made each see the other and apply neither).
func TestAPackWithASideBySideChangeAppliesItOnce(t *testing.T) {
	mux := consumer.NewMux()
	h := &applier{}
	mux.Register("order.purchased", "v1", h)
	mux.Register("order.purchased", "v2", h)
	k := relaybustest.New(t, mux, relaybustest.Options{Migrate: appliedTable})
	change := &event.Event{ID: "order-7-purchased", Type: "order.purchased", Topic: packTopic,
		Source: "order-service", AggregateID: "o-7", Version: 1}
	evs, err := event.SideBySide(change,
		event.Encoded{SchemaVersion: "v1", Payload: []byte(`{"amount":42}`)},
		event.Encoded{SchemaVersion: "v2", Payload: []byte(`{"amountCents":4200}`)})
	if err != nil {
		t.Fatal(err)
	}
	var msgs []event.Message
	for _, e := range evs {
		m, err := cloudevent.Encode(e, event.EncodingJSON)
		if err != nil {
			t.Fatal(err)
		}
		m.Attributes[topology.TargetConsumerAttr] = relaybustest.DefaultConsumerID
		msgs = append(msgs, m)
	}
	p, err := pack.Encode(msgs)
	if err != nil {
		t.Fatal(err)
	}
	p.ID, p.Topic, p.DeliveryAttempt = "m-side", packTopic, 1
	if r := deliver(k, p); r.Status != 200 {
		t.Fatalf("pack: %+v, want 200", r)
	}
	if got := appliedOf(t, k.DB).ids; !slices.Equal(got, []string{evs[0].ID}) {
		t.Errorf("applied %v, want the change once, from %s (the first version in the pack)", got, evs[0].ID)
	}
}
