package consume_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relaybus/relaybus/functions/consume"
	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/internal/pubsubtest"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/delivery"
	"github.com/relaybus/relaybus/shared/ledger"
	"github.com/relaybus/relaybus/shared/projection"
	"github.com/relaybus/relaybus/shared/registry"
	"github.com/relaybus/relaybus/shared/topology"
)

// BenchmarkConsume pushes wrapped push deliveries over real HTTP into the
// consume function: decode, inbox, generic projection and the attempt in
// one Postgres transaction, the attempt shipped to the Firestore ledger
// (the emulator) afterwards, with its rollup notice (pstest). First as fast
// as 16 concurrent senders go, then open loop at 1,000 deliveries/s for the
// latency percentiles, measured from each request's scheduled start.
func BenchmarkConsume(b *testing.B) { consumeBench(b, false) }

// BenchmarkConsumePgBouncer is BenchmarkConsume's throughput run through
// PgBouncer in transaction mode (pgx's exec query mode), as behind
// Supabase's pooler.
func BenchmarkConsumePgBouncer(b *testing.B) {
	pgtest.PgBouncerURL(b) // skips without one, outside CI
	b.Setenv(pgtest.EnvPooled, "1")
	consumeBench(b, true)
}

// directConsumeRate is BenchmarkConsume's throughput, for
// BenchmarkConsumePgBouncer's ratio in the same run.
var directConsumeRate float64

func consumeBench(b *testing.B, pooled bool) {
	ctx := context.Background()
	pool, _ := pgtest.SchemaConfig(b, func(c *pgxpool.Config) { c.MaxConns = 32 })
	if err := consume.Migrate(ctx, pool); err != nil {
		b.Fatal(err)
	}
	top, _ := topology.Load("")
	fake := pubsubtest.New(b)
	fake.Provision(b, top)
	project := emutest.FirestoreProject(b)
	store, err := ledger.Open(ctx, ledger.Config{ProjectID: project}, ledger.Options{Registry: registry.FromTopology(top)})
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	engine, err := consumer.New(consumer.Options{DB: pool, ConsumerID: "member-service", Subscription: sub, Handler: projection.Latest(),
		DeadLetters: fake.Client, Ledger: ledger.NewRecorder(store, fake.Client, top.Rollup.Topic)})
	if err != nil {
		b.Fatal(err)
	}
	h, err := consume.New(consume.Options{Engine: engine, DB: pool})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	var fsync, syncCommit string
	_ = pool.QueryRow(ctx, `SELECT current_setting('fsync'), current_setting('synchronous_commit')`).Scan(&fsync, &syncCommit)
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
		resp.Body.Close()
		return resp.StatusCode == 200
	}
	for range b.N {
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
		fmt.Printf("# consume: %d wrapped-push deliveries over HTTP, concurrency %d, generic projection; attempts shipped to the Firestore ledger (emulator) after the answer; Postgres fsync=%s synchronous_commit=%s\n",
			n, conc, fsync, syncCommit)
		if failed.Load() > 0 {
			fmt.Printf("# consume: %d deliveries not answered 200 (not counted in the rate)\n", failed.Load())
		}
		ok := float64(n-int(failed.Load())) / float64(n) * rate
		if pooled {
			fmt.Printf("# consume through PgBouncer 1.18, pool_mode=transaction, default_query_exec_mode=exec, the same run as above\n")
			if directConsumeRate > 0 {
				fmt.Printf("# consume through PgBouncer: %.2f of the direct figure in the same run (%.0f 1/s)\n", ok/directConsumeRate, directConsumeRate)
			}
			fmt.Printf("BENCH consume_deliveries_per_s_pgbouncer %.0f 1/s\n", ok)
			continue
		}
		directConsumeRate = ok
		fmt.Printf("BENCH consume_deliveries_per_s %.0f 1/s\n", ok)

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
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		ms := func(p float64) float64 {
			return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))].Microseconds()) / 1000
		}
		fmt.Printf("# consume latency: open loop at %d deliveries/s for %ds, request to 200, from each request's scheduled start; p50 %.2f ms, p90 %.2f ms, max %.2f ms\n",
			rate2, seconds, ms(0.5), ms(0.9), ms(1))
		if failed.Load() > 0 {
			fmt.Printf("# consume latency: %d deliveries not answered 200 (not in the percentiles)\n", failed.Load())
		}
		fmt.Printf("BENCH consume_p99_ms %.2f ms\n", ms(0.99))
		if err := engine.FlushLedger(ctx); err != nil {
			b.Fatal(err)
		}
		var unshipped int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM relaybus_attempts WHERE shipped_at IS NULL`).Scan(&unshipped)
		fmt.Printf("# consume: %d attempts not in the ledger after the run (left to /ledger:ship)\n", unshipped)
	}
}
