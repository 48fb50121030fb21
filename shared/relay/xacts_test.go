package relay_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relaybus/relaybus/internal/cost"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/relay"
)

// The publish path's transactions per event, counted by the server
// (pg_stat_database of a database of the test's own), not by the code:
// the write and the fast path's lease (EnqueueNow) in one transaction, the
// settle in one more (shared with concurrent requests' settles; none here,
// the requests come one after the other); a child event's settle gathered
// with the others of SettleWait into one statement (here long enough that
// the run's 50 share one or two). A rise above these fails the test.
const (
	maxXactsPerPublishedEvent = 2 // EnqueueNow + settle
	// maxStatementsPerPublishedEvent: EnqueueNow's one autocommit
	// statement (the write and the lease) and the settle; BEGIN, Enqueue,
	// Claim, COMMIT and the settle took five.
	maxStatementsPerPublishedEvent = 2
	maxXactsPerKickedEvent         = 2 // the kick's claim + settle, one event per kick (FlushKicks settles it)
	// A child event claimed in the transaction that enqueued it (KickIn):
	// nothing beyond that transaction but its share of a batched settle.
	maxXactsPerKickedInEvent = 0
	// settleBatches: the batched settles of one run of 50 child events
	// (SettleWait is a minute here: FlushKicks settles them).
	settleBatches = 2
	// describes: pgx describes each statement once per connection (its
	// statement cache), a transaction of its own on the server; the
	// background publishes of KickIn use up to the pool's 4 connections.
	describes = 10
)

func TestPublishPathTransactionsPerEvent(t *testing.T) {
	ctx := context.Background()
	url := pgtest.Database(t)
	setup, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.Migrate(ctx, setup); err != nil {
		t.Fatal(err)
	}
	setup.Close()
	pgtest.NoAutovacuum(t, url)
	e := newEnv(t)

	// run counts the transactions f commits or rolls back through a relay
	// of a pool of its own, closed before the reading.
	run := func(f func(r *relay.Relay, pool *pgxpool.Pool)) int64 {
		t.Helper()
		rctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		before, err := cost.Transactions(rctx, url)
		if err != nil {
			t.Fatal(err)
		}
		pool, err := pgxpool.New(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		r, err := relay.New(relay.Options{DB: pool, Publisher: e.fake.Client, Topology: e.top, SettleWait: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		f(r, pool)
		if err := r.Close(ctx); err != nil {
			t.Fatal(err)
		}
		pool.Close()
		after, err := cost.Transactions(rctx, url)
		if err != nil {
			t.Fatal(err)
		}
		return after - before
	}

	// What a relay costs with no event (its start and close) is left out.
	idle := run(func(*relay.Relay, *pgxpool.Pool) {})
	const events = 50
	var published []string
	stmts0, err := cost.Statements(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	xacts := run(func(r *relay.Relay, _ *pgxpool.Pool) {
		for i := range events {
			enq, claim, err := r.EnqueueNow(ctx, ev(fmt.Sprintf("order-x%02d", i), 1))
			if err != nil {
				t.Fatal(err)
			}
			published = append(published, enq[0].ID)
			states, err := r.PublishClaimed(ctx, claim)
			if err != nil {
				t.Fatal(err)
			}
			if states[enq[0].ID] != outbox.StatePublished {
				t.Fatalf("event %s: %q after the fast path, want published", enq[0].ID, states[enq[0].ID])
			}
		}
	}) - idle
	stmts1, err := cost.Statements(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	if per := float64(stmts1-stmts0) / events; per > maxStatementsPerPublishedEvent {
		t.Errorf("publish path: %.2f statements per event (%d for %d events), want at most %d", per, stmts1-stmts0, events, maxStatementsPerPublishedEvent)
	} else {
		t.Logf("publish path: %.2f statements per event", per)
	}
	if per := float64(xacts) / events; xacts > maxXactsPerPublishedEvent*events+describes {
		t.Errorf("publish path: %.2f transactions per event (%d for %d events), want at most %d (+%d describes)", per, xacts, events, maxXactsPerPublishedEvent, describes)
	} else {
		t.Logf("publish path: %.2f transactions per event", per)
	}

	// Child events: enqueued in the handler's transaction (not counted
	// here), kicked after it commits.
	var ids []string
	setup, err = pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	// The settles ran before the answers: the outbox says published.
	found, err := outbox.Lookup(ctx, setup, published...)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range published {
		if found[id].State != outbox.StatePublished {
			t.Fatalf("event %s: %q in the outbox after the relay closed, want published (settled)", id, found[id].State)
		}
	}
	for i := range events {
		enq, err := outbox.Enqueue(ctx, setup, ev(fmt.Sprintf("order-k%02d", i), 1))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, enq[0].ID)
	}
	setup.Close()
	xacts = run(func(r *relay.Relay, pool *pgxpool.Pool) {
		for _, id := range ids {
			r.Kick(id)
			if err := r.FlushKicks(ctx); err != nil {
				t.Fatal(err)
			}
		}
		found, err := outbox.Lookup(ctx, pool, ids...)
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range ids {
			if found[id].State != outbox.StatePublished {
				t.Fatalf("kicked event %s: %q, want published", id, found[id].State)
			}
		}
	})
	xacts -= idle + 1 // and the Lookup above
	if per := float64(xacts) / events; xacts > maxXactsPerKickedEvent*events+describes {
		t.Errorf("kicked events: %.2f transactions per event (%d for %d events), want at most %d (+%d describes)", per, xacts, events, maxXactsPerKickedEvent, describes)
	} else {
		t.Logf("kicked events: %.2f transactions per event", per)
	}

	// Child events claimed in their handler's transaction (KickIn), the
	// consume engine's way when its Kicker is a relay.
	var _ consumer.TxKicker = (*relay.Relay)(nil)
	xacts = run(func(r *relay.Relay, pool *pgxpool.Pool) {
		for i := range events {
			var publish func()
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				enq, err := outbox.Enqueue(ctx, tx, ev(fmt.Sprintf("order-t%02d", i), 1))
				if err != nil {
					return err
				}
				publish, err = r.KickIn(ctx, tx, enq[0].ID)
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			publish()
		}
		if err := r.FlushKicks(ctx); err != nil {
			t.Fatal(err)
		}
		c, err := outbox.Count(ctx, pool)
		if err != nil {
			t.Fatal(err)
		}
		if c.Pending != 0 {
			t.Fatalf("%d events pending after KickIn and FlushKicks, want 0", c.Pending)
		}
	})
	xacts -= idle + 1 + events // the Count above, and the enqueueing transactions
	if per := float64(xacts) / events; xacts > maxXactsPerKickedInEvent*events+settleBatches+describes {
		t.Errorf("events kicked in their transaction: %.2f transactions per event beyond it (%d for %d events), want at most %d (+%d batched settles, +%d describes)", per, xacts, events, maxXactsPerKickedInEvent, settleBatches, describes)
	} else {
		t.Logf("events kicked in their transaction: %.2f transactions per event beyond it", per)
	}
}
