package rollup

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/relaybus/relaybus/internal/ledger/model"
	"github.com/relaybus/relaybus/internal/ledger/query"

	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/projection"
)

// The happy path costs at most two Firestore writes and one read per
// event whatever the number of consumers, counted at the Firestore
// client's RPCs over the whole write path (the relay's send recorder,
// consume engines on Postgres shipping their attempts, the rollup
// function over HTTP fed by Pub/Sub), and no document is written more than
// once in a second.
func TestLedgerCostPerEventIsConstant(t *testing.T) {
	for _, n := range []int{1, 2, 5, 10} {
		t.Run(fmt.Sprintf("%d consumers", n), func(t *testing.T) {
			run := runLedger(t, n, 20, 50, ledgerScript{})
			if run.late+run.unwritten > 0 {
				t.Fatalf("%d of 20 events not CONSUMED (%d not in the ledger)", run.late, run.unwritten)
			}
			if run.writes > 2 || run.reads > 1 {
				t.Errorf("%.2f writes and %.2f reads per event, want at most 2 and 1", run.writes, run.reads)
			}
			if run.maxDocWrites > 1 {
				t.Errorf("a document got %d writes within a second, want at most 1", run.maxDocWrites)
			}
			// Every consumer's attempt is shown, though none is a document.
			d, err := query.New(run.store.Client()).Get(context.Background(), run.ids[0])
			if err != nil {
				t.Fatal(err)
			}
			if d.Summary() != fmt.Sprintf("%d/%d consumed", n, n) {
				t.Fatalf("detail %s", d.Summary())
			}
			for _, c := range d.Consumers {
				if len(c.Attempts) != 1 || !c.Attempts[0].Success || c.Attempts[0].ConsumedAt.IsZero() || c.Attempts[0].MessageID == "" {
					t.Errorf("%s: attempts %+v, want its one success with when and which message", c.ConsumerID, c.Attempts)
				}
			}
		})
	}
}

// failing fails consumer 0's first `fails` deliveries of each event
// (transiently: Pub/Sub redelivers), then applies the projection.
type failing struct {
	fails int
	mu    sync.Mutex
	seen  map[string]int
	next  consumer.Handler
}

func (f *failing) Handle(ctx context.Context, c *consumer.Context) error {
	f.mu.Lock()
	f.seen[c.Event.ID]++
	k := f.seen[c.Event.ID]
	f.mu.Unlock()
	if k <= f.fails {
		return consumer.Transient("upstream_down", errors.New("upstream: connection refused"))
	}
	return f.next.Handle(ctx, c)
}

func failFirst(fails int) func(i int) consumer.Handler {
	return func(i int) consumer.Handler {
		if i != 0 {
			return projection.Latest()
		}
		return &failing{fails: fails, seen: map[string]int{}, next: projection.Latest()}
	}
}

// A consumer that did not succeed at once keeps its whole history, errors
// included, as documents: a retry, a dead letter, a dead letter replayed.
// The event's document is still written at most twice (three times when
// the replay comes after its final status), and read at most once per
// write.
func TestLedgerCostOfFailures(t *testing.T) {
	for _, tc := range []struct {
		name     string
		script   ledgerScript
		attempts int // consumer 0's attempts, all kept as documents
		outcomes string
		writes   float64 // at most, per event
		reads    float64
	}{
		{"a retry", ledgerScript{handler: failFirst(1)}, 2, "retry,success", 2 + 2, 1},
		{"a dead letter", ledgerScript{handler: failFirst(99), maxAttempts: 3, final: model.StatusPartial}, 3, "retry,retry,dead_lettered", 2 + 3, 1},
		{"a replay", ledgerScript{handler: failFirst(3), maxAttempts: 3, replay: true}, 4, "retry,retry,dead_lettered,success", 3 + 4, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run := runLedger(t, 2, 10, 50, tc.script)
			if run.late+run.unwritten > 0 {
				t.Fatalf("%d of 10 events not %s (%d not in the ledger)", run.late, tc.script.final, run.unwritten)
			}
			if run.writes > tc.writes || run.reads > tc.reads {
				t.Errorf("%.2f writes and %.2f reads per event, want at most %.0f and %.0f", run.writes, run.reads, tc.writes, tc.reads)
			}
			d, err := query.New(run.store.Client()).Get(context.Background(), run.ids[0])
			if err != nil {
				t.Fatal(err)
			}
			c := d.Consumers[0]
			var outcomes []string
			for _, a := range c.Attempts {
				outcomes = append(outcomes, string(a.Outcome))
				if !a.Success && (a.ErrorCode != "upstream_down" || !strings.Contains(a.ErrorMessage, "connection refused")) {
					t.Errorf("attempt %d: %q %q, want the handler's error", a.AttemptNo, a.ErrorCode, a.ErrorMessage)
				}
			}
			if len(c.Attempts) != tc.attempts || strings.Join(outcomes, ",") != tc.outcomes {
				t.Errorf("%s's history %v, want %s", c.ConsumerID, outcomes, tc.outcomes)
			}
			if o := d.Consumers[1]; len(o.Attempts) != 1 || !o.Attempts[0].Success {
				t.Errorf("%s's history %+v, want its one success", o.ConsumerID, o.Attempts)
			}
			t.Logf("%s: %.2f writes, %.2f reads per event", tc.name, run.writes, run.reads)
		})
	}
}
