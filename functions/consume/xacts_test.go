package consume_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relaybus/relaybus/examples/shop"
	"github.com/relaybus/relaybus/functions/consume"
	"github.com/relaybus/relaybus/internal/cost"
	"github.com/relaybus/relaybus/internal/delivery"
	"github.com/relaybus/relaybus/internal/ledger/model"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/internal/pubsubtest"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/topology"
)

// The consume path's transactions per delivery, counted by the server
// (pg_stat_database of a database of the test's own), not by the code: a
// delivery is one transaction (count and claim, the handler's effect and
// child event, the attempt, no savepoint), and so is a duplicate (rolled
// back). A rise above these fails the test.
//
// With a ledger, the attempts the ledger took are marked shipped in one
// statement per second at most (not one per ledger batch, which was one
// per delivery or two): counted below as maxMarksPerSecond.
const (
	maxXactsPerDelivery  = 1
	maxXactsPerDuplicate = 1
	maxMarksPerSecond    = 1
	// describes: pgx describes each statement once per connection (its
	// statement cache), a transaction of its own on the server.
	describes = 6
)

func TestConsumePathTransactionsPerDelivery(t *testing.T) {
	ctx := context.Background()
	url := pgtest.Database(t)
	h := shop.Points() // a projection upsert and a child event per delivery
	setup, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	if err := consume.Migrate(ctx, setup); err != nil {
		t.Fatal(err)
	}
	if m, ok := h.(consume.Migrator); ok {
		if err := m.Migrate(ctx, setup); err != nil {
			t.Fatal(err)
		}
	}
	setup.Close()
	pgtest.NoAutovacuum(t, url)
	fake := pubsubtest.New(t)
	top, _ := topology.Load("")
	fake.Provision(t, top)

	// run counts the transactions f commits or rolls back through an
	// engine on a pool of its own (with the ledger led, for runWith),
	// closed before the reading.
	var runWith func(led consumer.Ledger, f func(e *consumer.Engine)) int64
	run := func(f func(e *consumer.Engine)) int64 {
		return runWith(nil, f)
	}
	runWith = func(led consumer.Ledger, f func(e *consumer.Engine)) int64 {
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
		e, err := consumer.New(consumer.Options{DB: pool, ConsumerID: "member-service", Subscription: sub,
			Handler: h, DeadLetters: fake.Client, Ledger: led})
		if err != nil {
			t.Fatal(err)
		}
		f(e)
		if err := e.Close(ctx); err != nil {
			t.Fatal(err)
		}
		pool.Close()
		after, err := cost.Transactions(rctx, url)
		if err != nil {
			t.Fatal(err)
		}
		return after - before
	}
	idle := run(func(*consumer.Engine) {})

	const deliveries = 50
	msgs := make([]event.Message, deliveries)
	for i := range msgs {
		msgs[i] = message(t, orderEvent(fmt.Sprintf("order-x%02d", i), 1))
	}
	deliver := func(want func(consumer.Result) bool) func(*consumer.Engine) {
		return func(e *consumer.Engine) {
			for _, m := range msgs {
				if r := e.Handle(ctx, delivery.Delivery{Mode: delivery.ModePush, Subscription: sub, Message: m}); !want(r) {
					t.Fatalf("delivery of %s: %+v", m.ID, r)
				}
			}
		}
	}
	xacts := run(deliver(func(r consumer.Result) bool { return r.Status == 200 && r.Outcome == model.OutcomeSuccess })) - idle
	if per := float64(xacts) / deliveries; xacts > maxXactsPerDelivery*deliveries+describes {
		t.Errorf("consume path: %.2f transactions per delivery (%d for %d), want at most %d (+%d describes)", per, xacts, deliveries, maxXactsPerDelivery, describes)
	} else {
		t.Logf("consume path: %.2f transactions per delivery", per)
	}
	xacts = run(deliver(func(r consumer.Result) bool { return r.Status == 200 && r.Duplicate })) - idle
	if per := float64(xacts) / deliveries; xacts > maxXactsPerDuplicate*deliveries+describes {
		t.Errorf("duplicates: %.2f transactions per delivery (%d for %d), want at most %d (+%d describes)", per, xacts, deliveries, maxXactsPerDuplicate, describes)
	} else {
		t.Logf("duplicates: %.2f transactions per delivery", per)
	}

	// With the ledger: the deliveries' transactions, and the shipped marks
	// of what the ledger took, one statement per second at most (the
	// engine's Close flushes the last).
	for i := range msgs {
		msgs[i] = message(t, orderEvent(fmt.Sprintf("order-l%02d", i), 1))
	}
	led := &memLedger{}
	idleLedger := runWith(led, func(*consumer.Engine) {})
	start := time.Now()
	xacts = runWith(led, deliver(func(r consumer.Result) bool { return r.Status == 200 && r.Outcome == model.OutcomeSuccess })) - idleLedger
	marks := maxMarksPerSecond * (int64(time.Since(start)/time.Second) + 1)
	if per := float64(xacts) / deliveries; xacts > maxXactsPerDelivery*deliveries+marks+describes {
		t.Errorf("with the ledger: %.2f transactions per delivery (%d for %d), want at most %d (+%d shipped marks, +%d describes)", per, xacts, deliveries, maxXactsPerDelivery, marks, describes)
	} else {
		t.Logf("with the ledger: %.2f transactions per delivery", per)
	}
	if n := len(led.all()); n != deliveries {
		t.Errorf("the ledger took %d attempts, want %d", n, deliveries)
	}
	check, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer check.Close()
	var unshipped int
	if err := check.QueryRow(ctx, `SELECT count(*) FROM relaybus_inbox_unshipped WHERE event_id LIKE 'order-l%'`).Scan(&unshipped); err != nil {
		t.Fatal(err)
	}
	if unshipped != 0 {
		t.Errorf("%d attempts not marked shipped after the engine closed, want 0", unshipped)
	}
}
