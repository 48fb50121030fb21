package ledger

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/relaybus/relaybus/shared/event"
)

// happyPath runs events through the ledger as the relay, consume and rollup
// do when everything succeeds: RecordSent for the batch, then per consumer
// one successful attempt followed by its rollup. It returns the store's
// reads and writes per event, not counting the registry (cached per topic).
func happyPath(tb testing.TB, s *Store, consumers, events int) (reads, writes float64) {
	tb.Helper()
	ctx := context.Background()
	topic := fmt.Sprintf("bench.n%d.events", consumers)
	var ids []string
	for i := 0; i < consumers; i++ {
		ids = append(ids, fmt.Sprintf("consumer-%d", i+1))
	}
	seed(tb, s, topic, ids...)
	batch := make([]*event.Event, events)
	for i := range batch {
		batch[i] = newEventOn(tb, topic, "thing.happened", time.Now())
	}
	before := s.Usage()
	if err := s.RecordSent(ctx, batch, time.Now()); err != nil {
		tb.Fatal(err)
	}
	for _, c := range ids {
		for _, e := range batch {
			if _, err := s.InsertAttempt(ctx, attempt(e, c, 1, OutcomeSuccess)); err != nil {
				tb.Fatal(err)
			}
			if _, err := s.Rollup(ctx, e.ID); err != nil {
				tb.Fatal(err)
			}
		}
	}
	after := s.Usage()
	for _, e := range batch {
		d, err := s.Get(ctx, e.ID)
		if err != nil {
			tb.Fatal(err)
		}
		if d.Event.Status != StatusConsumed {
			tb.Fatalf("%s ended %s", e.ID, d.Event.Status)
		}
	}
	r := (after.Reads - after.ByOp[OpRegistry].Reads) - (before.Reads - before.ByOp[OpRegistry].Reads)
	w := after.Writes - before.Writes
	return float64(r) / float64(events), float64(w) / float64(events)
}

// The cost goal: at most N+2 writes per event in the happy path (the event,
// N attempts, one final status), and reads of 1+k per rollup (the event and
// the k attempts recorded so far).
func TestHappyPathCost(t *testing.T) {
	for _, n := range []int{1, 2, 5} {
		t.Run(fmt.Sprintf("n%d", n), func(t *testing.T) {
			s := newStore(t, Options{Registry: nil})
			reads, writes := happyPath(t, s, n, 10)
			if writes != float64(n+2) {
				t.Errorf("%.2f writes per event with %d consumers, want %d", writes, n, n+2)
			}
			wantReads := float64(n + n*(n+1)/2)
			if reads != wantReads {
				t.Errorf("%.2f reads per event with %d consumers, want %.0f", reads, n, wantReads)
			}
		})
	}
}
