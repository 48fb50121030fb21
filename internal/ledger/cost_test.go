package ledger

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/fscount"
	"github.com/relaybus/relaybus/internal/ledger/model"

	"github.com/relaybus/relaybus/shared/event"
)

// happyPath runs events through the ledger as the relay, consume and rollup
// do when everything succeeds and the consumers report together: RecordSent
// for the batch, every consumer's successful attempt (RecordAttempts), then
// one rollup of the batch, as the rollup function does with the notices
// that reach it within its coalescing window. It returns the reads and
// writes per event its client's RPCs carried (counted by c), not counting
// the registry's read of the topic's consumers (cached per topic in
// production), which it counts alone and subtracts.
func happyPath(tb testing.TB, s *testStore, c *fscount.Counter, consumers, events int) (reads, writes float64) {
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
	r0 := c.Reads()
	if _, err := s.ExpectedConsumers(ctx, topic); err != nil {
		tb.Fatal(err)
	}
	registryReads := c.Reads() - r0
	r0, w0 := c.Reads(), c.Writes()
	if err := s.RecordSent(ctx, model.SentAt(time.Now(), batch...)); err != nil {
		tb.Fatal(err)
	}
	var as []model.Attempt
	eventIDs := make([]string, len(batch))
	for i, e := range batch {
		eventIDs[i] = e.ID
		for _, c := range ids {
			as = append(as, attempt(e, c, 1, model.OutcomeSuccess))
		}
	}
	if err := s.InsertAttempts(ctx, as); err != nil {
		tb.Fatal(err)
	}
	rs, err := s.RollupMany(ctx, eventIDs)
	if err != nil {
		tb.Fatal(err)
	}
	for _, r := range rs {
		if r.Err != nil {
			tb.Fatal(r.Err)
		}
	}
	r, w := c.Reads()-r0-registryReads, c.Writes()-w0
	for _, e := range batch {
		d, err := s.Get(ctx, e.ID)
		if err != nil {
			tb.Fatal(err)
		}
		if d.Event.Status != model.StatusConsumed {
			tb.Fatalf("%s ended %s", e.ID, d.Event.Status)
		}
	}
	return float64(r) / float64(events), float64(w) / float64(events)
}

// The cost goal: at most N+2 writes per event in the happy path (the event,
// N attempts, one final status) and 2N+1 reads (the event, and each
// consumer's next attemptWindow attempts by id, read once by the one
// rollup).
func TestHappyPathCost(t *testing.T) {
	for _, n := range []int{1, 2, 5} {
		t.Run(fmt.Sprintf("n%d", n), func(t *testing.T) {
			s, c := newCountedStore(t, Options{Registry: nil})
			reads, writes := happyPath(t, s, c, n, 10)
			if writes != float64(n+2) {
				t.Errorf("%.2f writes per event with %d consumers, want %d", writes, n, n+2)
			}
			wantReads := float64(1 + n*attemptWindow)
			if reads != wantReads {
				t.Errorf("%.2f reads per event with %d consumers, want %.0f", reads, n, wantReads)
			}
		})
	}
}
