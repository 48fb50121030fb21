package relay_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/ledger/model"
	"github.com/relaybus/relaybus/internal/ledger/query"

	"github.com/relaybus/relaybus/internal/emulator"
	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/ledger"
	"github.com/relaybus/relaybus/internal/registry"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/relay"
)

// failingSends makes the ledger's RecordSent fail while down is set, as a
// Firestore outage between the outbox and the ledger would.
type failingSends struct {
	*ledger.Store
	down atomic.Bool
}

func (f *failingSends) RecordSent(ctx context.Context, sends []model.Sent) error {
	if f.down.Load() {
		return errors.New("firestore unavailable")
	}
	return f.Store.RecordSent(ctx, sends)
}

// Firestore unreachable during a drain: every event is still published (the
// outbox is the truth, the ledger only records), and once Firestore is back
// the drain's healing step records the sends the live recorder missed; a
// drain after that heals nothing more.
func TestLedgerMissedSendsAreHealedByALaterDrain(t *testing.T) {
	ctx := context.Background()
	emutest.Host(t, emulator.Firestore)
	e := newEnv(t)
	store, err := ledger.Open(ctx, ledger.Config{ProjectID: emutest.FirestoreProject(t)},
		ledger.Options{Registry: registry.FromTopology(e.top)})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	led := &failingSends{Store: store}
	led.down.Store(true)
	var clk clock
	r := e.relay(t, relay.Options{Ledger: led, Now: clk.now})
	defer r.Close(ctx)
	fill(t, e.pool, 3, 2)
	sum, err := r.Drain(ctx, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Published != 6 || e.rec.msgs != 6 {
		t.Fatalf("ledger down: %+v, %d on Pub/Sub; want all 6 published anyway", sum, e.rec.msgs)
	}
	if err := r.FlushLedger(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := query.New(store.Client()).Get(ctx, aggKey(0)+"-v1"); !errors.Is(err, model.ErrEventNotFound) {
		t.Fatalf("the ledger has the event although its write failed: %v", err)
	}
	led.down.Store(false)
	// Before the heal delay the live recorder still has its chance.
	if sum, err := r.Drain(ctx, 10*time.Second); err != nil || sum.LedgerHealed != 0 {
		t.Fatalf("drain before the heal delay: %+v %v", sum, err)
	}
	clk.add(relay.DefaultHealDelay + time.Second)
	sum, err = r.Drain(ctx, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if sum.LedgerHealed != 6 || sum.Published != 0 {
		t.Fatalf("drain after the heal delay: %+v, want 6 healed and nothing published again", sum)
	}
	for a := range 3 {
		for v := 1; v <= 2; v++ {
			d, err := query.New(store.Client()).Get(ctx, aggKey(a)+"-v"+string(rune('0'+v)))
			if err != nil || d.Event.Status != model.StatusSent || len(d.Event.ExpectedConsumers) != 2 || d.Event.EnqueuedAt.IsZero() {
				t.Errorf("%s v%d in the ledger: %+v %v", aggKey(a), v, d.Event, err)
			}
		}
	}
	clk.add(time.Hour)
	if sum, _ := r.Drain(ctx, 10*time.Second); sum.LedgerHealed != 0 {
		t.Errorf("healed again: %+v", sum)
	}
}

// With the ledger up, the live recorder records every send within moments of
// the drain, and the healing step finds nothing to do.
func TestLedgerRecordsSendsAfterTheFact(t *testing.T) {
	ctx := context.Background()
	emutest.Host(t, emulator.Firestore)
	e := newEnv(t)
	store, err := ledger.Open(ctx, ledger.Config{ProjectID: emutest.FirestoreProject(t)},
		ledger.Options{Registry: registry.FromTopology(e.top)})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	var clk clock
	r := e.relay(t, relay.Options{Ledger: store, Now: clk.now})
	defer r.Close(ctx)
	fill(t, e.pool, 4, 3)
	if sum, err := r.Drain(ctx, 10*time.Second); err != nil || sum.Published != 12 {
		t.Fatalf("drain: %+v %v", sum, err)
	}
	if err := r.FlushLedger(ctx); err != nil {
		t.Fatal(err)
	}
	d, err := query.New(store.Client()).Get(ctx, aggKey(2)+"-v3")
	if err != nil || d.Event.Status != model.StatusSent || d.Event.SentAt.IsZero() {
		t.Fatalf("after the drain: %+v %v", d.Event, err)
	}
	clk.add(relay.DefaultHealDelay + time.Second)
	if sum, err := r.Drain(ctx, 10*time.Second); err != nil || sum.LedgerHealed != 0 {
		t.Errorf("the healing step found work the live recorder had done: %+v %v", sum, err)
	}
	var behind int
	_ = e.pool.QueryRow(ctx, `SELECT count(*) FROM relaybus_outbox_dispatch WHERE ledger_version < published_version OR ledger_due_at IS NOT NULL`).Scan(&behind)
	if behind != 0 {
		t.Errorf("%d aggregates still wait for the ledger", behind)
	}
}

// countingSends counts the ledger's RecordSent calls and the sends they
// carry: each call is a Firestore request or more.
type countingSends struct {
	*ledger.Store
	calls, sends atomic.Int64
}

func (c *countingSends) RecordSent(ctx context.Context, sends []model.Sent) error {
	c.calls.Add(1)
	c.sends.Add(int64(len(sends)))
	return c.Store.RecordSent(ctx, sends)
}

// The fast path settles an event a request; the sends of requests that
// follow one another within LedgerWait are recorded by one RecordSent, not
// one each, after the answers (which never wait for it), and every one of
// them is in the ledger.
func TestFastPathSendsShareOneLedgerWrite(t *testing.T) {
	ctx := context.Background()
	emutest.Host(t, emulator.Firestore)
	e := newEnv(t)
	store, err := ledger.Open(ctx, ledger.Config{ProjectID: emutest.FirestoreProject(t)},
		ledger.Options{Registry: registry.FromTopology(e.top)})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	led := &countingSends{Store: store}
	r := e.relay(t, relay.Options{Ledger: led, LedgerWait: time.Minute, HealDelay: time.Hour})
	defer r.Close(ctx)
	const requests = 10
	for i := range requests {
		_, claim, err := r.EnqueueNow(ctx, ev(aggKey(i), 1))
		if err != nil {
			t.Fatal(err)
		}
		states, err := r.PublishClaimed(ctx, claim)
		if err != nil || states[aggKey(i)+"-v1"] != outbox.StatePublished {
			t.Fatalf("request %d: %v %v, want published", i, states, err)
		}
	}
	if n := led.calls.Load(); n != 0 {
		t.Fatalf("%d RecordSent calls before LedgerWait ended, want none yet", n)
	}
	if err := r.FlushLedger(ctx); err != nil {
		t.Fatal(err)
	}
	if calls, sends := led.calls.Load(), led.sends.Load(); calls != 1 || sends != requests {
		t.Errorf("%d RecordSent calls for %d sends, want 1 for %d", calls, sends, requests)
	}
	for i := range requests {
		d, err := query.New(store.Client()).Get(ctx, aggKey(i)+"-v1")
		if err != nil || d.Event.Status != model.StatusSent {
			t.Errorf("%s in the ledger: %+v %v, want SENT", aggKey(i), d.Event, err)
		}
	}
}
