package devstack

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/shared/ledger"
)

// BenchmarkLocalStack starts the stack as make dev does with nothing
// running (a fresh Postgres cluster, the Firestore emulator, pstest) and
// reports the startup time; then publishes order.purchased at 200 events/s
// for 10 s (two consumers: member-service by push, message-service by
// Eventarc) and reports publish's 202 to each consumer's commit (the
// attempt's consumedAt, written right after the commit) and publish to
// CONSUMED in the ledger (statusAt).
func BenchmarkLocalStack(b *testing.B) {
	ctx := context.Background()
	for range b.N {
		// The cluster runs as the postgres user when we are root: its
		// directory must be reachable (b.TempDir is 0700).
		state, err := os.MkdirTemp("", "relaybus-bench-")
		if err != nil {
			b.Fatal(err)
		}
		defer os.RemoveAll(state)
		_ = os.Chmod(state, 0o755)
		t0 := time.Now()
		s, err := Start(ctx, Options{Addr: "127.0.0.1:0", StateDir: state, Project: emutest.UniqueProject(b)})
		if err != nil {
			b.Fatal(err)
		}
		startup := time.Since(t0)
		fmt.Printf("# startup: Start() to serving, with a new Postgres cluster and the Firestore emulator started by the stack\n")
		fmt.Printf("BENCH startup_s %.2f s\n", startup.Seconds())

		const rate, seconds = 200, 5
		n := rate * seconds
		type sent struct {
			id string
			at time.Time
		}
		sends := make([]sent, n)
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
		var wg sync.WaitGroup
		begin := time.Now()
		for i := range n {
			at := begin.Add(time.Duration(i) * time.Second / rate)
			time.Sleep(time.Until(at))
			wg.Add(1)
			go func() {
				defer wg.Done()
				body, _ := json.Marshal(map[string]any{"eventType": "order.purchased", "topic": "shop.order.events",
					"aggregateId": fmt.Sprintf("bench-%d", i), "version": 1, "source": "order-service",
					"payload": map[string]any{"orderId": fmt.Sprintf("bench-%d", i), "memberId": fmt.Sprintf("m-%d", i%100), "amount": 10}})
				resp, err := client.Post(s.Info.URL+"/publish", "application/json", bytes.NewReader(body))
				if err != nil {
					return
				}
				var r struct {
					EventID string `json:"eventId"`
				}
				_ = json.NewDecoder(resp.Body).Decode(&r)
				resp.Body.Close()
				sends[i] = sent{r.EventID, time.Now()}
			}()
		}
		wg.Wait()
		var commit, consumed []time.Duration
		late := 0
		deadline := time.Now().Add(3 * time.Minute)
		for _, snd := range sends {
			if snd.id == "" {
				b.Fatal("a publish failed")
			}
			for {
				d, err := s.Ledger.Get(ctx, snd.id)
				if err == nil && d.Event.Status == ledger.StatusConsumed {
					for _, c := range d.Consumers {
						for _, a := range c.Attempts {
							commit = append(commit, a.ConsumedAt.Sub(snd.at))
						}
					}
					consumed = append(consumed, d.Event.StatusAt.Sub(snd.at))
					break
				}
				if time.Now().After(deadline) {
					late++
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
		if len(consumed) == 0 {
			b.Fatalf("no event reached CONSUMED")
		}
		if late > 0 {
			fmt.Printf("# e2e: %d of %d events were not CONSUMED within 3 minutes (the figures below cover the others)\n", late, n)
		}
		pct := func(ds []time.Duration, p int) float64 {
			sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
			return float64(ds[len(ds)*p/100].Microseconds()) / 1000
		}
		fmt.Printf("# e2e: %d events at %d/s over 2 consumers (push and Eventarc shapes) on the local stack; from publish's 202 to each consumer's commit; to CONSUMED in the ledger\n", n, rate)
		fmt.Printf("BENCH e2e_p50_ms %.1f ms\nBENCH e2e_p99_ms %.1f ms\n", pct(commit, 50), pct(commit, 99))
		fmt.Printf("BENCH e2e_consumed_p50_ms %.1f ms\nBENCH e2e_consumed_p99_ms %.1f ms\n", pct(consumed, 50), pct(consumed, 99))
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		s.Close(cctx)
		cancel()
	}
}
