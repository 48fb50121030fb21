package consume_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/benchcheck"
	"github.com/relaybus/relaybus/internal/cost"
	"github.com/relaybus/relaybus/internal/delivery"
	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/fnproc"
	"github.com/relaybus/relaybus/internal/percentile"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/internal/pubsubtest"
	"github.com/relaybus/relaybus/shared/broker/pubsub"
	"github.com/relaybus/relaybus/shared/topology"
)

// BenchmarkConsume pushes wrapped push deliveries over real HTTP into the
// consume function: decode, inbox, generic projection and the attempt in
// one Postgres transaction, the attempt shipped to the Firestore ledger
// (the emulator) afterwards, with its rollup notice (pstest). First as fast
// as 16 concurrent senders go, then open loop at 1,000 deliveries/s for the
// latency percentiles, measured from each request's scheduled start.
func BenchmarkConsume(b *testing.B) { consumeBench(b, false) }

// BenchmarkConsumePgBouncer is BenchmarkConsume's throughput run,
// interleaved direct and through PgBouncer in transaction mode (pgx's
// exec query mode, as behind Supabase's pooler), three rounds of each; it
// reports the median pooled rate with the rounds' ratios.
func BenchmarkConsumePgBouncer(b *testing.B) {
	pgtest.PgBouncerURL(b) // skips without one, outside CI
	var direct, pooled []float64
	for range 3 {
		b.Setenv(pgtest.EnvPooled, "")
		direct = append(direct, consumeBench(b, true))
		b.Setenv(pgtest.EnvPooled, "1")
		pooled = append(pooled, consumeBench(b, true))
	}
	benchcheck.Compare(b, "consume_deliveries_per_s_pgbouncer",
		"consume_deliveries_per_s direct → through PgBouncer 1.18 (pool_mode=transaction, default_query_exec_mode=exec)", direct, pooled, true)
	benchcheck.Figure(b, "consume_deliveries_per_s_pgbouncer", benchcheck.Median(pooled), "1/s")
}

// consumeBench runs the consume benchmark and returns its throughput;
// throughputOnly stops there, printing no figure (the PgBouncer
// comparison's rounds).
func consumeBench(b *testing.B, throughputOnly bool) float64 {
	ctx := context.Background()
	// The function runs in a process of its own, built by its constructor
	// from its configuration as in production (CONSUMER_HANDLER defaults
	// to the generic projection), so its CPU time is its own.
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
	const poolSize = 32
	fn := fnproc.Start(b, "consume", map[string]string{
		"DATABASE_URL":         withParams(pgtest.SchemaURL(b, schema), fmt.Sprintf("pool_max_conns=%d", poolSize)),
		"GOOGLE_CLOUD_PROJECT": project, "PUBSUB_EMULATOR_HOST": fake.Server.Addr, "LOG_LEVEL": "error",
		"CONSUMER_ID": "member-service", "CONSUMER_SUBSCRIPTION": sub,
	})
	if err := fn.Warm(ctx); err != nil {
		b.Fatal(err)
	}
	srv := struct{ URL string }{fn.URL}
	durable := pgtest.RequireDurable(b)
	bodies := func(prefix string, n int) [][]byte {
		out := make([][]byte, n)
		for i := range out {
			m := message(b, orderEvent(fmt.Sprintf("%s-%d", prefix, i%2000), int64(i/2000+1)))
			out[i] = delivery.WrappedBody(m, sub, 1)
		}
		return out
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, MaxIdleConns: 256}}
	send := func(body []byte) bool {
		resp, err := client.Post(srv.URL, "application/json", bytes.NewReader(body))
		if err != nil {
			return false
		}
		// Read to the end, so the connection is kept alive, as Pub/Sub's
		// push keeps its own: a body closed unread closes the connection,
		// and the function's CPU then paid a TCP connection per delivery.
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode == 200
	}
	stmts0, err := cost.StatementSnapshot(ctx, pgtest.URL(b))
	if err != nil {
		b.Fatal(err)
	}
	cpu0, err := fn.CPU()
	if err != nil {
		b.Fatal(err)
	}
	answered := 0
	var directRate float64
	{
		const n, conc = 20000, 16
		work := bodies(fmt.Sprintf("thr%d", time.Now().UnixNano()), n)
		var next, failed atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for range conc {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := next.Add(1) - 1; i < n; i = next.Add(1) - 1 {
					if !send(work[i]) {
						failed.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		rate := float64(n) / time.Since(start).Seconds()
		answered += n - int(failed.Load())
		fmt.Printf("# consume: %d wrapped-push deliveries over HTTP, concurrency %d, generic projection, the function in its own process (instance.Main, pool %d); attempts shipped to the Firestore ledger (emulator) after the answer; Postgres %s\n",
			n, conc, poolSize, durable)
		if failed.Load() > 0 {
			b.Fatalf("consume: %d of %d deliveries not answered 200: the run prints no figure", failed.Load(), n)
		}
		ok := rate
		if throughputOnly {
			_, _ = fn.StopCPU()
			return ok
		}
		benchcheck.Figure(b, "consume_deliveries_per_s", ok, "1/s")
		directRate = ok

		const rate2, seconds = 1000, 5
		lat := make([]time.Duration, 0, rate2*seconds)
		var mu sync.Mutex
		failed.Store(0)
		work = bodies(fmt.Sprintf("lat%d", time.Now().UnixNano()), rate2*seconds)
		begin := time.Now()
		for i := range work {
			at := begin.Add(time.Duration(i) * time.Second / rate2)
			time.Sleep(time.Until(at))
			wg.Add(1)
			go func() {
				defer wg.Done()
				if !send(work[i]) {
					failed.Add(1)
					return
				}
				d := time.Since(at)
				mu.Lock()
				lat = append(lat, d)
				mu.Unlock()
			}()
		}
		wg.Wait()
		if failed.Load() > 0 {
			b.Fatalf("consume latency: %d of %d deliveries not answered 200: the run prints no figure", failed.Load(), len(work))
		}
		slices.Sort(lat)
		ms := func(p float64) float64 { return float64(percentile.Sorted(lat, p).Microseconds()) / 1000 }
		fmt.Printf("# consume latency: open loop at %d deliveries/s for %ds, request to 200, from each request's scheduled start, over all %d deliveries; p50 %.2f ms, p90 %.2f ms, max %.2f ms\n",
			rate2, seconds, len(lat), ms(0.5), ms(0.9), ms(1))
		benchcheck.Figure(b, "consume_p99_ms", ms(0.99), "ms")
		answered += len(lat)
	}
	// The attempts' shipping to the ledger runs after the answers: the
	// function's graceful shutdown (SIGTERM) flushes it before its CPU and
	// statements are counted, so each delivery pays its whole share.
	cpu1, err := fn.StopCPU()
	if err != nil {
		b.Fatal(err)
	}
	stmts1, err := cost.StatementSnapshot(ctx, pgtest.URL(b))
	if err != nil {
		b.Fatal(err)
	}
	var unshipped int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM relaybus_inbox_unshipped`).Scan(&unshipped)
	fmt.Printf("# consume: %d attempts not in the ledger after the run (left to /ledger:ship)\n", unshipped)
	fmt.Printf("# consume cost: the function process's user+system CPU (/proc, then its rusage at exit) and the statements Postgres executed (pg_stat_statements calls, transaction control included) over both runs to the end of its graceful shutdown, divided by the %d deliveries answered 200\n", answered)
	// Every delivery was applied once: the inbox holds each event the
	// runs sent.
	var applied int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM relaybus_inbox WHERE consumer_id = 'member-service'`).Scan(&applied); err != nil {
		b.Fatal(err)
	}
	if applied != answered {
		b.Fatalf("consume: %d deliveries answered 200, %d events in the inbox: the run prints no figure", answered, applied)
	}
	benchcheck.Figure(b, "consume_cpu_us_per_delivery", float64((cpu1-cpu0).Microseconds())/float64(answered), "µs")
	stmts := stmts1.Since(stmts0)
	cost.PrintStatements(os.Stdout, "consume statements", "delivery", stmts, answered, 8)
	benchcheck.Figure(b, "consume_pg_roundtrips_per_delivery", float64(cost.Calls(stmts))/float64(answered), "round trips")
	return directRate
}

// withParams adds query parameters to a postgres:// URL.
func withParams(url string, params ...string) string {
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + strings.Join(params, "&")
}
