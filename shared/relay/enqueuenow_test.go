package relay_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/relay"
)

// EnqueueNow leases in the statement that writes the events. A publish
// that dies or is cancelled between that statement and Pub/Sub leaves the
// lease behind: no other relay takes the aggregate while it holds, and once
// it expires the drain publishes the events in order. A killed publish sent
// nothing, so each event reaches Pub/Sub once; a cancelled one may have
// handed its messages to the Pub/Sub client before it gave up without
// settling, so the drain sends them again (at least once, as every
// unsettled publish; the consumers' inbox drops the repeat).
func TestEnqueueNowLeaseOfADeadPublishIsDrainedWhenItExpires(t *testing.T) {
	for name, tc := range map[string]struct {
		die         func(r *relay.Relay, c *relay.Claim)
		mayHaveSent bool
	}{
		// The process is gone: nothing publishes the claim.
		"killed": {die: func(*relay.Relay, *relay.Claim) {}},
		// The request is cancelled as its publish starts.
		"cancelled": {die: func(r *relay.Relay, c *relay.Claim) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			_, _ = r.PublishClaimed(ctx, c)
		}, mayHaveSent: true},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			e := newEnv(t)
			var clk clock
			dying := e.relay(t, relay.Options{Owner: "dying", Now: clk.now, Lease: 20 * time.Second})
			enq, claim, err := dying.EnqueueNow(ctx, ev("order-d", 1), ev("order-d", 2))
			if err != nil {
				t.Fatal(err)
			}
			if enq[0].State != outbox.StatePending || enq[1].State != outbox.StatePending {
				t.Fatalf("enqueued %+v", enq)
			}
			var owner string
			if err := e.pool.QueryRow(ctx, `SELECT coalesce(lease_owner, '') FROM relaybus_outbox_dispatch WHERE aggregateid = 'order-d'`).Scan(&owner); err != nil {
				t.Fatal(err)
			}
			if owner != "dying" {
				t.Fatalf("lease owner %q after EnqueueNow, want the statement's own (dying)", owner)
			}
			tc.die(dying, claim)
			other := e.relay(t, relay.Options{Now: clk.now})
			if !tc.mayHaveSent {
				if v := e.rec.versions("order-d"); len(v) != 0 {
					t.Fatalf("a killed publish sent %v", v)
				}
				sum, err := other.Drain(ctx, 10*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				if sum.Claimed != 0 || sum.Published != 0 || sum.Remaining != 2 {
					t.Fatalf("while the dead publish's lease holds: %+v; want its 2 events left alone", sum)
				}
				if v := e.rec.versions("order-d"); len(v) != 0 {
					t.Fatalf("published %v under another relay's lease", v)
				}
			}
			clk.add(21 * time.Second) // the lease expires
			waitDrained(t, other, e.pool)
			v := e.rec.versions("order-d")
			if !tc.mayHaveSent && fmt.Sprint(v) != "[1 2]" {
				t.Fatalf("order-d reached Pub/Sub as %v, want [1 2] once each", v)
			}
			if first := firstOccurrences(v); fmt.Sprint(first) != "[1 2]" {
				t.Fatalf("order-d reached Pub/Sub as %v, want 1 before 2, each at least once", v)
			}
		})
	}
}

// The fast path's answer and order: EnqueueNow's lease is published at
// once; an event behind an unpublished version (not leased by the
// statement) is claimed with its backlog by PublishClaimed and published
// after it; an event of an aggregate another relay holds stays pending.
func TestEnqueueNowPublishesWhatItLeasedAndClaimsTheRest(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	r := e.relay(t, relay.Options{})
	if _, err := outbox.Enqueue(ctx, e.pool, ev("order-b", 1), ev("order-h", 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Claim(ctx, e.pool, outbox.ClaimOptions{Owner: "other", Lease: time.Minute, Aggregates: 1, RunLimit: 1,
		Limit: 1, Events: []string{"order-h-v1"}}); err != nil {
		t.Fatal(err)
	}
	_, claim, err := r.EnqueueNow(ctx, ev("order-f", 1), ev("order-b", 2), ev("order-h", 2))
	if err != nil {
		t.Fatal(err)
	}
	got, err := r.PublishClaimed(ctx, claim)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]outbox.State{"order-f-v1": outbox.StatePublished, "order-b-v2": outbox.StatePublished, "order-h-v2": outbox.StatePending}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("PublishClaimed = %v, want %v", got, want)
	}
	for key, want := range map[string]string{"order-f": "[1]", "order-b": "[1 2]", "order-h": "[]"} {
		if v := e.rec.versions(key); fmt.Sprint(v) != want {
			t.Errorf("%s reached Pub/Sub as %v, want %s", key, v, want)
		}
	}
	// The settle ran before the answer: the outbox agrees.
	found, err := outbox.Lookup(ctx, e.pool, "order-f-v1", "order-b-v2")
	if err != nil {
		t.Fatal(err)
	}
	for id, q := range found {
		if q.State != outbox.StatePublished {
			t.Errorf("%s: %s in the outbox after the answer", id, q.State)
		}
	}
}

// The published message of a leased run is the one the drain would send
// for the same row: the run is built from the caller's events, and must
// carry what the outbox stores (times at the microsecond).
func TestEnqueueNowPublishesWhatTheOutboxStores(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	r := e.relay(t, relay.Options{})
	x := ev("order-t", 1)
	x.OccurredAt = time.Date(2026, 3, 4, 5, 6, 7, 891234567, time.UTC)
	x.Initiator = event.Initiator{Service: "order-service", Operation: "createOrder", UserID: "u-1"}
	_, claim, err := r.EnqueueNow(ctx, x)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.PublishClaimed(ctx, claim); err != nil {
		t.Fatal(err)
	}
	msgs := e.fake.Server.Messages()
	if len(msgs) != 1 {
		t.Fatalf("%d messages, want 1", len(msgs))
	}
	if got := msgs[0].Attributes[event.AttrOccurredAt]; got != "2026-03-04T05:06:07.891234Z" {
		t.Errorf("occurred_at attribute %q, want the stored time at the microsecond", got)
	}
	if got := msgs[0].Attributes[event.AttrUserID]; got != "u-1" {
		t.Errorf("user id attribute %q, want u-1", got)
	}
}

// firstOccurrences is v without its repeats, in the order each first came.
func firstOccurrences(v []int64) []int64 {
	var out []int64
	seen := map[int64]bool{}
	for _, x := range v {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}
