package relay_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/eventually"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/relay"
)

// A scheduled event reaches Pub/Sub only once the relay's clock passes its
// deliverAt; the version enqueued after it on its aggregate waits for it,
// another aggregate does not; a relay that leased it and died (its lease
// abandoned) neither published it early nor lost it.
func TestScheduledEventIsPublishedAtItsTimeInOrder(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	var clk clock
	due := time.Now().Add(10 * time.Minute)
	sched := ev("sched", 1)
	sched.DeliverAt = due
	if _, err := outbox.Enqueue(ctx, e.pool, sched); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Enqueue(ctx, e.pool, ev("sched", 2), ev("other", 1)); err != nil {
		t.Fatal(err)
	}
	r := e.relay(t, relay.Options{Now: clk.now})
	if !eventually.Within(10*time.Second, func() bool {
		if _, err := r.Drain(ctx, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		return len(e.rec.versions("other")) == 1
	}) {
		t.Fatal("the other aggregate was not published")
	}
	// Drained up to now: the scheduled aggregate is untouched.
	if _, err := r.Drain(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := e.rec.versions("sched"); len(got) != 0 {
		t.Fatalf("published before its time: %v", got)
	}

	// At its time a relay leases it and dies before publishing.
	runs, err := outbox.Claim(ctx, e.pool, outbox.ClaimOptions{Owner: "doomed", Lease: time.Minute, Aggregates: 10,
		RunLimit: 10, Limit: 10, Now: due.Add(time.Second)})
	if err != nil || len(runs) != 1 || len(runs[0].Rows) != 2 {
		t.Fatalf("the doomed relay's claim at its time: %+v %v", runs, err)
	}
	clk.add(time.Until(due) + 30*time.Second) // due, but the dead relay's lease holds
	if _, err := r.Drain(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := e.rec.versions("sched"); len(got) != 0 {
		t.Fatalf("published under another relay's lease: %v", got)
	}
	clk.add(time.Minute) // the lease is abandoned
	if !eventually.Within(10*time.Second, func() bool {
		if _, err := r.Drain(ctx, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		return len(e.rec.versions("sched")) == 2
	}) {
		t.Fatalf("not published after its time: %v", e.rec.versions("sched"))
	}
	if got := fmt.Sprint(e.rec.versions("sched")); got != "[1 2]" {
		t.Fatalf("order: %s, want [1 2]", got)
	}
}

// A cancelled scheduled event is never published; the version behind it is,
// without waiting for the cancelled one's time.
func TestCancelledScheduledEventIsNeverPublished(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	var clk clock
	sched := ev("c", 1)
	sched.DeliverAt = time.Now().Add(time.Hour)
	if _, err := outbox.Enqueue(ctx, e.pool, sched, ev("c", 2)); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Cancel(ctx, e.pool, sched.ID, outbox.CancelOptions{Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	r := e.relay(t, relay.Options{Now: clk.now})
	if !eventually.Within(10*time.Second, func() bool {
		if _, err := r.Drain(ctx, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		return len(e.rec.versions("c")) > 0
	}) {
		t.Fatal("version 2 was not published")
	}
	clk.add(2 * time.Hour) // past the cancelled one's time
	if _, err := r.Drain(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(e.rec.versions("c")); got != "[2]" {
		t.Fatalf("published %s, want [2] alone", got)
	}
}
