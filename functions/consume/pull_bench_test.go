package consume_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/benchcheck"
	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/fnproc"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/internal/pubsubtest"
	"github.com/relaybus/relaybus/shared/broker/pubsub"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/topology"
)

// BenchmarkConsumePull is BenchmarkConsume's throughput in pull mode
// (CONSUMER_MODE=pull): the same work (20,000 order events on 2,000
// aggregates, decode, inbox, generic projection and attempt in one
// Postgres transaction, the ledger on), queued on the consumer's ordered
// subscription (pstest) before the function starts; the function, in a
// process of its own built by its one constructor from its environment,
// pulls it with PULL_MAX_IN_FLIGHT 16 (BenchmarkConsume's concurrency).
// The rate counts the deliveries applied from the first inbox row seen to
// the last, so the function's start is not in it.
func BenchmarkConsumePull(b *testing.B) {
	for range b.N {
		consumePullBench(b)
	}
}

func consumePullBench(b *testing.B) {
	ctx := context.Background()
	pool, schema := pgtest.SchemaConfig(b, nil)
	top, _ := topology.Load("")
	project := emutest.FirestoreProject(b)
	fake := pubsubtest.New(b)
	ps, err := pubsub.Dial(ctx, project, fake.Server.Addr, pubsub.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer ps.Close()
	if err := ps.Provision(ctx, top); err != nil {
		b.Fatal(err)
	}
	const n, aggregates, poolSize, inFlight = 20000, 2000, 32, 16
	run := fmt.Sprintf("pull%d", time.Now().UnixNano())
	sink, keyOf := benchcheck.NewDetailedSink(), map[string]string{}
	for a := range aggregates {
		msgs := make([]event.Message, 0, n/aggregates)
		for v := 1; v <= n/aggregates; v++ {
			e := orderEvent(fmt.Sprintf("%s-%d", run, a), int64(v))
			sink.Sent(e.AggregateID, e.ID)
			keyOf[e.ID] = e.AggregateID
			msgs = append(msgs, message(b, e))
		}
		if got, err := ps.PublishBatch(ctx, topic, msgs); err != nil || got != len(msgs) {
			b.Fatalf("queue the events: %d of %d published: %v", got, len(msgs), err)
		}
	}
	durable := pgtest.RequireDurable(b)
	fn := fnproc.Start(b, "consume", map[string]string{
		"DATABASE_URL":         withParams(pgtest.SchemaURL(b, schema), fmt.Sprintf("pool_max_conns=%d", poolSize)),
		"GOOGLE_CLOUD_PROJECT": project, "PUBSUB_EMULATOR_HOST": fake.Server.Addr, "LOG_LEVEL": "error",
		"CONSUMER_ID": "member-service", "CONSUMER_SUBSCRIPTION": sub,
		"CONSUMER_MODE": "pull", "PULL_MAX_IN_FLIGHT": fmt.Sprint(inFlight),
	})
	// Built (migrated, pulling) before the first count; stopped when the
	// benchmark ends.
	if err := fn.Warm(ctx); err != nil {
		b.Fatal(err)
	}
	count := func() int {
		var c int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM relaybus_inbox WHERE consumer_id = 'member-service'`).Scan(&c); err != nil {
			b.Fatal(err)
		}
		return c
	}
	var (
		first   time.Time
		atFirst int
	)
	deadline := time.Now().Add(10 * time.Minute)
	c := 0
	for c < n && time.Now().Before(deadline) {
		c = count()
		if first.IsZero() && c > 0 {
			first, atFirst = time.Now(), c
		}
		time.Sleep(20 * time.Millisecond) // polling the database, not synchronizing
	}
	took := time.Since(first)
	fmt.Printf("# consume pull: %d order events on %d aggregates queued on an ordered subscription (pstest), CONSUMER_MODE=pull, PULL_MAX_IN_FLIGHT %d, generic projection, the function in its own process (instance.Main, pool %d); ledger on (emulator); Postgres %s; %d applied in %v after the first inbox row\n",
		n, aggregates, inFlight, poolSize, durable, c-atFirst, took.Round(time.Millisecond))
	if c < n {
		b.Fatalf("%d of %d events applied within 10 minutes", c, n)
	}
	// The order each aggregate's events were applied in: one key's
	// deliveries run one after the other, each transaction starting after
	// the one before committed.
	rows, err := pool.Query(ctx, `SELECT event_id FROM relaybus_inbox WHERE consumer_id = 'member-service' ORDER BY processed_at, xmin::text::bigint`)
	if err != nil {
		b.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			b.Fatal(err)
		}
		sink.Got(keyOf[id], id)
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
	sink.Require(b, "consume pull")
	benchcheck.Figure(b, "consume_pull_deliveries_per_s", float64(c-atFirst)/took.Seconds(), "1/s")
}
