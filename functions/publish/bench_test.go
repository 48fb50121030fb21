package publish_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/relaybus/relaybus/functions/publish"
	"github.com/relaybus/relaybus/internal/benchcheck"
	"github.com/relaybus/relaybus/internal/cost"
	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/fnproc"
	"github.com/relaybus/relaybus/internal/ledger"
	"github.com/relaybus/relaybus/internal/ledger/consumers"
	"github.com/relaybus/relaybus/internal/percentile"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/internal/pubsubtest"
	"github.com/relaybus/relaybus/internal/registry"
	"github.com/relaybus/relaybus/shared/broker/pubsub"
	"github.com/relaybus/relaybus/shared/outbox"
)

// BenchmarkPublish measures the publish function from request to 202 with
// the fast path's Pub/Sub ack included, under an open-loop load: requests
// arrive at a fixed rate whatever the answers' latency (a closed loop would
// slow down with the server and hide its queueing), and each latency is
// counted from the request's scheduled start, so a stalled server is
// charged for the requests waiting behind it.
//
// The function runs in a process of its own (fnproc: the test binary
// started again as instance.Main("publish"), built from its configuration
// as in production), over real HTTP (keep-alive client), local Postgres,
// the fast path to pstest, and the Firestore ledger on (the emulator): the
// topic registry is the ledger's topic_consumers behind its cache, and the
// relay records every send after the answer. It runs its
// fixed load once, whatever b.N.
func BenchmarkPublish(b *testing.B) {
	r := publishLoad(b, true, nil)
	benchcheck.Figure(b, "publish_p50_ms", r.p50, "ms")
	benchcheck.Figure(b, "publish_p99_ms", r.p99, "ms")
}

// benchRate is the publish load's requests per second. BENCH.md's figures
// are at 500; a lower rate lets a busy shared machine count the CPU and
// the statements of each request (the comment line says the rate used).
var benchRate = flag.Int("publish.rate", 500, "BenchmarkPublish's requests per second (BENCH.md's figures: 500)")

// publishLoad runs BenchmarkPublish's load, prints how it ran and returns
// its p50 and p99 in milliseconds and the function's CPU per request.
// With primary false (a comparison's extra runs) its BENCH lines of
// cost are left out; env is added to the function's environment.
func publishLoad(b *testing.B, primary bool, env map[string]string) loadResult {
	const (
		aggregates = 1000
		warmup     = 300
	)
	rate := *benchRate
	duration := 10 * time.Second
	if testing.Short() {
		duration = 2 * time.Second
	}
	total := int(duration.Seconds() * float64(rate))
	const poolSize = 16

	ctx := context.Background()
	// The function runs in a process of its own, built by its constructor
	// from its configuration as in production, so its CPU time is its own.
	pool, schema := pgtest.SchemaConfig(b, nil)
	if err := outbox.Migrate(ctx, pool); err != nil {
		b.Fatal(err)
	}
	top := loadTopology(b)
	topPath := filepath.Join(b.TempDir(), "topology.yaml")
	if err := os.WriteFile(topPath, []byte(testTopology), 0o644); err != nil {
		b.Fatal(err)
	}
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
	store, err := ledger.Open(ctx, ledger.Config{ProjectID: project}, ledger.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	if _, err := consumers.New(store.Client(), consumers.Options{}).SyncConsumers(ctx, registry.Consumers(top), consumers.SyncOptions{}); err != nil {
		b.Fatal(err)
	}
	fnEnv := map[string]string{
		"DATABASE_URL":         pgtest.SchemaURL(b, schema) + fmt.Sprintf("&pool_max_conns=%d&pool_min_conns=%d", poolSize, poolSize),
		"GOOGLE_CLOUD_PROJECT": project, "PUBSUB_EMULATOR_HOST": fake.Server.Addr, "RELAYBUS_TOPOLOGY": topPath, "LOG_LEVEL": "error",
		"PUBLISH_RATE_LIMIT": "0", // one client sends everything: the per-caller limit is not what is measured
	}
	for k, v := range env {
		fnEnv[k] = v
	}
	fn := fnproc.Start(b, "publish", fnEnv)
	if err := fn.Warm(ctx); err != nil {
		b.Fatal(err)
	}
	srv := struct{ URL string }{fn.URL}
	client := &http.Client{Transport: &http.Transport{MaxIdleConns: 1024, MaxIdleConnsPerHost: 1024, IdleConnTimeout: time.Minute}}

	payload := []byte(`{"orderId":"ORD-2026-000001","amount":99.5,"currency":"EUR","items":[{"sku":"SKU-1","qty":2},{"sku":"SKU-2","qty":1}],"customer":{"id":"user-123","tier":"gold"}}`)
	body := func(prefix string, i int) []byte {
		agg := fmt.Sprintf("%s-%d", prefix, i%aggregates)
		b, _ := json.Marshal(map[string]any{
			"eventId": fmt.Sprintf("%s-%d", prefix, i), "eventType": "order.purchased", "topic": "shop.order.events",
			"aggregateId": agg, "version": i/aggregates + 1, "payload": json.RawMessage(payload),
			"initiator": map[string]string{"service": "order-service", "operation": "createOrder", "userId": "user-123"},
		})
		return b
	}
	type outcome struct {
		latency time.Duration
		status  int
		result  string
		err     error
	}
	send := func(b []byte, start time.Time) outcome {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return outcome{err: err}
		}
		rb, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		o := outcome{latency: time.Since(start), status: resp.StatusCode, err: err}
		var r publish.Result
		if json.Unmarshal(rb, &r) == nil {
			o.result = r.Status
		}
		return o
	}

	// Warm up connections, the pool, the registry cache and the publisher.
	warmBodies := make([][]byte, warmup)
	for i := range warmBodies {
		warmBodies[i] = body("warm", i)
	}
	var wg sync.WaitGroup
	for i := range warmBodies {
		wg.Add(1)
		go func() { defer wg.Done(); send(warmBodies[i], time.Now()) }()
		time.Sleep(time.Second / time.Duration(rate))
	}
	wg.Wait()

	bodies := make([][]byte, total)
	for i := range bodies {
		bodies[i] = body("bench", i)
	}
	outcomes := make([]outcome, total)
	stmts0, err := cost.StatementSnapshot(ctx, pgtest.URL(b))
	if err != nil {
		b.Fatal(err)
	}
	cpu0, err := fn.CPU()
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	start := time.Now()
	interval := time.Second / time.Duration(rate)
	for i := range bodies {
		at := start.Add(time.Duration(i) * interval)
		if d := time.Until(at); d > 0 {
			time.Sleep(d)
		}
		wg.Add(1)
		go func() { defer wg.Done(); outcomes[i] = send(bodies[i], at) }()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	// The fast path's settles and the sends' ledger records run after the
	// answers: the function's graceful shutdown (SIGTERM) flushes them
	// before its CPU and statements are counted.
	cpu1, err := fn.StopCPU()
	if err != nil {
		b.Fatal(err)
	}
	stmts1, err := cost.StatementSnapshot(ctx, pgtest.URL(b))
	if err != nil {
		b.Fatal(err)
	}

	lat := make([]time.Duration, 0, total)
	published, pending, failed := 0, 0, 0
	for _, o := range outcomes {
		if o.err != nil || o.status != http.StatusAccepted {
			failed++
			continue
		}
		switch o.result {
		case publish.StatusPublished:
			published++
			lat = append(lat, o.latency)
		case publish.StatusPending:
			// A 202 pending is not the answer measured (the event is left to
			// the relay): the benchmarks count non-final answers apart
			// (docs/benchmarks.md).
			pending++
		default:
			failed++
		}
	}
	if len(lat) == 0 {
		b.Fatalf("no request of %d got a 202 published (%d pending, %d failed)", total, pending, failed)
	}
	// Every event accepted (202, published or pending) is in the outbox,
	// once.
	var written int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM relaybus_outbox WHERE id LIKE 'bench-%'`).Scan(&written); err != nil {
		b.Fatal(err)
	}
	if written != published+pending {
		b.Fatalf("publish: %d events accepted (%d published, %d pending), %d in the outbox: the run prints no figure", published+pending, published, pending, written)
	}
	slices.Sort(lat)
	pct := func(p float64) float64 { return float64(percentile.Sorted(lat, p).Microseconds()) / 1000 }
	durable := pgtest.RequireDurable(b)
	fmt.Printf("# publish: %d requests at %d req/s open loop (sent over %s, last answer at %s), plain JSON envelope, %d-byte payload, %d aggregates; "+
		"latency from each request's scheduled start to its 202; fast path on (%d published, %d pending), Firestore ledger on (emulator; sends recorded after the answer); "+
		"the function in its own process (instance.Main), Postgres pool %d (%s), pstest; the percentiles over the %d answered 202 published; p90 %.2f ms, p99.9 %.2f ms, max %.2f ms\n",
		total, rate, (time.Duration(total-1) * interval).Round(time.Millisecond), elapsed.Round(time.Millisecond), len(payload), aggregates,
		published, pending, poolSize, durable, len(lat), pct(0.90), pct(0.999), pct(1))
	if failed > 0 {
		fmt.Printf("# publish: %d of %d requests did not get a 202 published (not in the percentiles)\n", failed, total)
	}
	if pending > 0 {
		fmt.Printf("# publish: %d of %d requests answered 202 pending, left to the relay (not in the percentiles)\n", pending, total)
	}
	if primary {
		// Refused and pending requests cost CPU and statements too: the
		// divisor is every request the run sent, the work all of them
		// caused (the same as per event accepted when all were published).
		fmt.Printf("# publish cost: the function process's user+system CPU (/proc, then its rusage at exit) and the statements Postgres executed (pg_stat_statements calls, transaction control included) from the run's start to the end of its graceful shutdown, divided by all %d requests (%d published, %d pending, %d refused)\n",
			total, published, pending, failed)
		benchcheck.Figure(b, "publish_cpu_us_per_event", float64((cpu1-cpu0).Microseconds())/float64(total), "µs")
		stmts := stmts1.Since(stmts0)
		cost.PrintStatements(os.Stdout, "publish statements", "request", stmts, total, 8)
		benchcheck.Figure(b, "publish_pg_roundtrips_per_event", float64(cost.Calls(stmts))/float64(total), "round trips")
	}
	return loadResult{p50: pct(0.50), p99: pct(0.99), cpuUS: float64((cpu1 - cpu0).Microseconds()) / float64(total)}
}

// loadResult is one publishLoad's p50 and p99 in milliseconds, and the
// function process's CPU per request answered, in µs.
type loadResult struct{ p50, p99, cpuUS float64 }

// interleavedLoads runs publishLoad three times on each side, in the
// order A, B, A, B, A, B (envA or envB added to the function's
// environment), and returns each side's runs in order. The runs of a long
// benchmark drift (the shared Postgres and emulators carry the earlier
// runs' data and background work; a quiet machine's runs got slower one
// after the other): pairing each A with the B after it and taking the
// median of the pairs' ratios (benchcheck.Overhead) charges the drift to
// neither side.
func interleavedLoads(b *testing.B, envA, envB map[string]string) (a, bb []loadResult) {
	for range 3 {
		a = append(a, publishLoad(b, false, envA))
		bb = append(bb, publishLoad(b, false, envB))
	}
	return a, bb
}

// p50s and cpus are a side's runs' p50s and CPU per request.
func p50s(rs []loadResult) []float64 {
	out := make([]float64, len(rs))
	for i, r := range rs {
		out[i] = r.p50
	}
	return out
}

func cpus(rs []loadResult) []float64 {
	out := make([]float64, len(rs))
	for i, r := range rs {
		out[i] = r.cpuUS
	}
	return out
}

// printCPUOverhead prints the CPU per request of an overhead benchmark's
// rounds: at 500 req/s on a small machine the p50 sits near saturation
// and moves a lot between identical runs, the CPU the function spends per
// request does not.
func printCPUOverhead(b *testing.B, what string, off, on []loadResult) {
	benchcheck.Compare(b, what+" (CPU)", "the function's CPU per request, µs", cpus(off), cpus(on), false)
}
