package relay_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/claimcheck"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/relay"
)

// bigEvent is a 12 MB JSON event: over Pub/Sub's 10 MB.
func bigEvent(agg string, version int64) *event.Event {
	e := ev(agg, version)
	e.Payload = []byte(`{"blob":"` + strings.Repeat("a", 12<<20) + `"}`)
	return e
}

// A claim-check store that fails is a publish failure of that event only:
// retried with backoff, never FAILED, the other aggregates published; once
// the store works the event goes out as a reference. Without a claim check
// the same event is FAILED at once, naming the setting.
func TestClaimCheckStoreFailureIsRetried(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	dir := t.TempDir()
	store, err := claimcheck.NewDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	checker, err := claimcheck.New(claimcheck.Options{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	// The topic's directory cannot be made: a file is in its place.
	blocker := filepath.Join(dir, topic)
	if err := os.WriteFile(blocker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var clk clock
	r := e.relay(t, relay.Options{Claims: checker, Now: clk.now})
	defer r.Close(ctx)
	if _, err := outbox.Enqueue(ctx, e.pool, bigEvent("order-big", 1), ev("order-small", 1)); err != nil {
		t.Fatal(err)
	}
	sum, err := r.Drain(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Published != 1 || sum.Retried != 1 || sum.Failed != 0 {
		t.Fatalf("store failing: %+v, want the small one published and the big one retried", sum)
	}
	var state, lastErr string
	if err := e.pool.QueryRow(ctx, `SELECT state, last_error FROM relaybus_outbox_backlog WHERE aggregateid = 'order-big'`).Scan(&state, &lastErr); err != nil {
		t.Fatal(err)
	}
	if state != "retrying" || !strings.Contains(lastErr, "claimcheck: store") {
		t.Fatalf("order-big: %s %q, want retrying with the store's error", state, lastErr)
	}

	if err := os.Remove(blocker); err != nil {
		t.Fatal(err)
	}
	clk.add(time.Hour) // past the retry's backoff
	if sum, err = r.Drain(ctx, time.Minute); err != nil || sum.Published != 1 {
		t.Fatalf("store back: %+v, %v; want order-big published", sum, err)
	}
	var claimed int
	for _, m := range e.fake.Server.Messages() {
		if ref := m.Attributes[event.AttrClaimCheck]; ref != "" {
			claimed++
			if ref != store.Ref(claimcheck.Key(topic, "order-big-v1")) || len(m.Data) != 0 {
				t.Errorf("claimed message: reference %q, %d bytes of data", ref, len(m.Data))
			}
		}
	}
	if claimed != 1 || e.rec.msgs != 2 {
		t.Errorf("%d claimed of %d messages, want 1 of 2", claimed, e.rec.msgs)
	}

	// A re-push of the large event goes out by reference too.
	if _, err := outbox.Repush(ctx, e.pool, bigEvent("order-big", 1), ""); err != nil {
		t.Fatal(err)
	}
	if sum, err = r.Drain(ctx, time.Minute); err != nil || sum.Repushed != 1 {
		t.Fatalf("re-push: %+v, %v; want 1 re-pushed", sum, err)
	}
	msgs := e.fake.Server.Messages()
	if last := msgs[len(msgs)-1]; last.Attributes[event.AttrClaimCheck] == "" || len(last.Data) != 0 {
		t.Errorf("the re-push carried %d bytes of data and reference %q, want a reference", len(last.Data), last.Attributes[event.AttrClaimCheck])
	}

	// No claim check: FAILED at its first publish, the error naming the setting.
	plain := e.relay(t, relay.Options{Now: clk.now})
	defer plain.Close(ctx)
	if _, err := outbox.Enqueue(ctx, e.pool, bigEvent("order-big-2", 1)); err != nil {
		t.Fatal(err)
	}
	if sum, err = plain.Drain(ctx, time.Minute); err != nil || sum.Failed != 1 {
		t.Fatalf("without a claim check: %+v, %v; want FAILED", sum, err)
	}
	if err := e.pool.QueryRow(ctx, `SELECT state, last_error FROM relaybus_outbox_backlog WHERE aggregateid = 'order-big-2'`).Scan(&state, &lastErr); err != nil {
		t.Fatal(err)
	}
	if state != "failed" || !strings.Contains(lastErr, "CLAIM_CHECK_BUCKET") {
		t.Errorf("order-big-2: %s %q, want failed naming CLAIM_CHECK_BUCKET", state, lastErr)
	}
}
