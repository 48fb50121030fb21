package relay_test

import (
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/pubsubtest"

	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/relay"
)

// BenchmarkDrain drains a backlog of queued events (RELAYBUS_BENCH_EVENTS,
// default 200,000, on 500 aggregates) into in-process pstest and reports
// the sustained rate and the process's peak resident memory.
func BenchmarkDrain(b *testing.B) {
	events := 200_000
	if s := os.Getenv("RELAYBUS_BENCH_EVENTS"); s != "" {
		events, _ = strconv.Atoi(s)
	}
	const aggregates = 500
	ctx := context.Background()
	for range b.N {
		b.StopTimer()
		e := newEnv(b)
		// The relay's work ends when Pub/Sub acknowledges; the subscriptions'
		// fan-out is the service's cost, and pstest's grows with every
		// message it stores, so the benchmark's topic has no subscriptions.
		for _, c := range e.top.Consumers() {
			_ = e.fake.Client.PubSub().SubscriptionAdminClient.DeleteSubscription(ctx, &pb.DeleteSubscriptionRequest{
				Subscription: "projects/" + pubsubtest.Project + "/subscriptions/" + c.Subscription()})
		}
		fill(b, e.pool, aggregates, int64(events/aggregates))
		if _, err := e.pool.Exec(ctx, `ANALYZE relaybus_outbox`); err != nil { // as autovacuum would have by now
			b.Fatal(err)
		}
		runtime.GC()
		batch, _ := strconv.Atoi(os.Getenv("RELAYBUS_BENCH_BATCH"))
		conc, _ := strconv.Atoi(os.Getenv("RELAYBUS_BENCH_CONC"))
		r, err := relay.New(relay.Options{DB: e.pool, Publisher: e.fake.Client, Topology: e.top, BatchSize: batch, Concurrency: conc})
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		published := 0
		for {
			sum, err := r.Drain(ctx, 10*time.Minute)
			if err != nil {
				b.Fatal(err)
			}
			published += sum.Published
			if sum.Remaining == 0 {
				break
			}
		}
		elapsed := time.Since(start)
		b.StopTimer()
		c, _ := outbox.Count(ctx, e.pool)
		if published != events || c.Pending != 0 || e.rec.msgs != events {
			b.Fatalf("published %d, Pub/Sub got %d, %d pending; want %d", published, e.rec.msgs, c.Pending, events)
		}
		fmt.Printf("# relay drain: %d events on %d aggregates, batch %d, concurrency %d, local Postgres, in-process pstest with ordering\n",
			events, aggregates, relay.DefaultBatchSize, relay.DefaultConcurrency)
		fmt.Printf("BENCH relay_events_per_s %.0f ev/s\n", float64(events)/elapsed.Seconds())
		fmt.Printf("# peak RSS is VmHWM of the benchmark process (relay, pstest and the test's own backlog building)\n")
		fmt.Printf("BENCH relay_peak_rss_mb %.1f MB\n", peakRSSMB())
	}
}

func peakRSSMB() float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			f := strings.Fields(line)
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}
