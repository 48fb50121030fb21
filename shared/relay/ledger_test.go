package relay_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/emulator"
	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/ledger"
	"github.com/relaybus/relaybus/shared/registry"
	"github.com/relaybus/relaybus/shared/relay"
)

// failingSends makes the ledger's RecordSent fail while down is set, as a
// Firestore outage between the outbox and the ledger would.
type failingSends struct {
	*ledger.Store
	down atomic.Bool
}

func (f *failingSends) RecordSent(ctx context.Context, events []*event.Event, at time.Time) error {
	if f.down.Load() {
		return errors.New("firestore unavailable")
	}
	return f.Store.RecordSent(ctx, events, at)
}

// Published while the ledger was down: the events still reach Pub/Sub (the
// outbox is the truth), and the next drain records them in the ledger.
func TestLedgerMissedSendsAreHealedByTheNextDrain(t *testing.T) {
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
	r := e.relay(t, relay.Options{Ledger: led})
	fill(t, e.pool, 3, 2)
	sum, err := r.Drain(ctx, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Published != 6 || e.rec.msgs != 6 {
		t.Fatalf("ledger down: %+v, %d on Pub/Sub; want all 6 published anyway", sum, e.rec.msgs)
	}
	if _, err := store.Get(ctx, aggKey(0)+"-v1"); !errors.Is(err, ledger.ErrEventNotFound) {
		t.Fatalf("the ledger has the event although its write failed: %v", err)
	}
	led.down.Store(false)
	sum, err = r.Drain(ctx, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if sum.LedgerHealed != 6 || sum.Published != 0 {
		t.Fatalf("next drain: %+v, want 6 healed and nothing published again", sum)
	}
	for a := range 3 {
		for v := 1; v <= 2; v++ {
			d, err := store.Get(ctx, aggKey(a)+"-v"+string(rune('0'+v)))
			if err != nil || d.Event.Status != ledger.StatusSent || len(d.Event.ExpectedConsumers) != 2 {
				t.Errorf("%s v%d in the ledger: %+v %v", aggKey(a), v, d.Event.Status, err)
			}
		}
	}
	if sum, _ := r.Drain(ctx, 10*time.Second); sum.LedgerHealed != 0 {
		t.Errorf("healed again: %+v", sum)
	}
}
