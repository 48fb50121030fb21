package consume_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/relaybus/relaybus/functions/consume"
	"github.com/relaybus/relaybus/internal/delivery"
	"github.com/relaybus/relaybus/internal/ledger/model"
	"github.com/relaybus/relaybus/internal/pgpool"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/internal/pubsubtest"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/topology"
)

// A handler's last statement (consumer.Context.AtCommit) on the pool the
// functions run on: the last statement goes out with the COMMIT (a
// delivery takes one round trip more than the handler's other
// statements: BEGIN with the inbox statement), everything the
// handler wrote commits with the inbox row, and scan gets the row. A last
// statement that fails rolls the whole attempt back (the handler's other
// write and the inbox row with it), the delivery is answered 503 with a
// recorded retry, and the redelivery applies once.
func TestLastStatementGoesOutWithTheCommit(t *testing.T) {
	ctx := context.Background()
	cfg, err := pgpool.ParseConfig(pgtest.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	trips := &pgtest.RoundTrips{}
	cfg.ConnConfig.Tracer = trips
	pool, err := pgpool.New(ctx, cfg, pgpool.RetryPolicy{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := consume.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE t_first (id text PRIMARY KEY);
		CREATE TABLE t_last (id text PRIMARY KEY, n bigint CHECK (n < 100))`); err != nil {
		t.Fatal(err)
	}
	var scanned atomic.Int64
	var failLast atomic.Bool
	h := consumer.HandlerFunc(func(ctx context.Context, c *consumer.Context) error {
		if _, err := c.Tx.Exec(ctx, `INSERT INTO t_first VALUES ($1)`, c.Event.ID); err != nil {
			return err
		}
		n := c.Event.Version
		if failLast.Load() {
			n = 500 // breaks t_last's check
		}
		return c.AtCommit(ctx, `INSERT INTO t_last VALUES ($1, $2) RETURNING n`, []any{c.Event.ID, n},
			func(row pgx.Row) error {
				var got int64
				if err := row.Scan(&got); err != nil {
					return err
				}
				scanned.Store(got)
				return nil
			})
	})
	fake := pubsubtest.New(t)
	top, _ := topology.Load("")
	fake.Provision(t, top)
	led := &memLedger{}
	engine, err := consumer.New(consumer.Options{DB: pool, ConsumerID: "member-service", Subscription: sub, Handler: h,
		DeadLetters: fake.Client, Ledger: led, MaxDeliveryAttempts: 5})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = engine.Close(context.Background()) })
	deliver := func(agg string, version int64, attempt int) consumer.Result {
		t.Helper()
		m := message(t, orderEvent(agg, version))
		m.DeliveryAttempt = attempt
		return engine.Handle(ctx, delivery.Delivery{Mode: delivery.ModePush, Subscription: sub, Message: m})
	}
	count := func(table string) (n int) {
		t.Helper()
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	before := trips.Count()
	if r := deliver("order-1", 7, 1); r.Status != http.StatusOK || r.Outcome != model.OutcomeSuccess {
		t.Fatalf("delivery: %+v", r)
	}
	if n := trips.Count() - before; n != 3 {
		t.Errorf("a delivery took %d round trips; want 3 (BEGIN with the inbox statement, the handler's insert, the last statement with the COMMIT)", n)
	}
	if got := scanned.Load(); got != 7 {
		t.Errorf("scan got %d; want the statement's row, 7", got)
	}
	if count("t_first") != 1 || count("t_last") != 1 || count("relaybus_inbox") != 1 {
		t.Fatalf("after the delivery: %d, %d, %d rows in t_first, t_last, the inbox; want 1 each",
			count("t_first"), count("t_last"), count("relaybus_inbox"))
	}

	failLast.Store(true)
	r := deliver("order-2", 1, 1)
	if r.Status != http.StatusServiceUnavailable || r.Outcome != model.OutcomeRetry || r.Code != "database" {
		t.Fatalf("a failing last statement: %+v; want 503, retry, code database", r)
	}
	if count("t_first") != 1 || count("t_last") != 1 || count("relaybus_inbox") != 1 {
		t.Fatalf("after the failed attempt: %d, %d, %d rows in t_first, t_last, the inbox; want the first delivery's only",
			count("t_first"), count("t_last"), count("relaybus_inbox"))
	}
	failLast.Store(false)
	if r := deliver("order-2", 1, 2); r.Status != http.StatusOK || r.Attempt != 2 {
		t.Fatalf("the redelivery: %+v; want 200, attempt 2", r)
	}
	if r := deliver("order-2", 1, 3); !r.Duplicate {
		t.Fatalf("a second redelivery: %+v; want a duplicate", r)
	}
	if count("t_first") != 2 || count("t_last") != 2 {
		t.Fatalf("%d, %d rows in t_first, t_last; want 2 each (each event applied once)", count("t_first"), count("t_last"))
	}
	if n := pool.Stat().AcquiredConns(); n != 0 {
		t.Errorf("%d connections held after the deliveries; want 0", n)
	}
}
