package consume_test

import (
	"bytes"
	"fmt"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/relaybus/relaybus/internal/pgtest"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relaybus/relaybus/shared/delivery"
	"github.com/relaybus/relaybus/shared/projection"
)

// BenchmarkConsume pushes wrapped push deliveries over real HTTP into the
// consume function (decode, inbox, generic projection in one Postgres
// transaction, ledger off): first as fast as 16 concurrent senders go,
// then open-loop at 1,000 deliveries/s for the latency percentiles.
func BenchmarkConsume(b *testing.B) {
	pool, _ := pgtest.SchemaConfig(b, func(c *pgxpool.Config) { c.MaxConns = 32 })
	s := newStackOn(b, pool, projection.Latest(), "member-service")
	bodies := func(prefix string, n int) [][]byte {
		out := make([][]byte, n)
		for i := range out {
			m := message(b, orderEvent(fmt.Sprintf("%s-%d", prefix, i%2000), int64(i/2000+1)))
			out[i] = delivery.WrappedBody(m, sub, 1)
		}
		return out
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	send := func(body []byte) bool {
		resp, err := client.Post(s.url, "application/json", bytes.NewReader(body))
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	}
	for range b.N {
		const n, conc = 20000, 16
		work := bodies("thr", n)
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
		if failed.Load() > 0 {
			b.Fatalf("%d deliveries failed", failed.Load())
		}
		fmt.Printf("# consume: %d wrapped-push deliveries over HTTP, concurrency %d, generic projection, local Postgres, ledger off\n", n, conc)
		fmt.Printf("BENCH consume_deliveries_per_s %.0f 1/s\n", rate)

		const rate2, seconds = 1000, 5
		lat := make([]time.Duration, rate2*seconds)
		work = bodies("lat", len(lat))
		begin := time.Now()
		for i := range work {
			at := begin.Add(time.Duration(i) * time.Second / rate2)
			time.Sleep(time.Until(at))
			wg.Add(1)
			go func() {
				defer wg.Done()
				if !send(work[i]) {
					failed.Add(1)
				}
				lat[i] = time.Since(at)
			}()
		}
		wg.Wait()
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		fmt.Printf("# consume latency: open loop at %d deliveries/s for %ds, request to 200, from each request's scheduled start\n", rate2, seconds)
		fmt.Printf("BENCH consume_p99_ms %.2f ms\n", float64(lat[len(lat)*99/100].Microseconds())/1000)
	}
}
