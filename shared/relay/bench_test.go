package relay_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relaybus/relaybus/internal/benchcheck"
	"github.com/relaybus/relaybus/internal/cost"
	"github.com/relaybus/relaybus/internal/emulator"
	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/percentile"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/shared/broker/pubsub"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/relay"
	"github.com/relaybus/relaybus/shared/topology"
)

// benchPubSub connects to the Pub/Sub the benchmarks publish to: the gcloud
// emulator with -relay.pubsub=emulator (PUBSUB_EMULATOR_HOST), else
// pstest in a process of its own (internal/cmd/pstest), so that the fake's
// store of every message is not part of the relay's heap. Only the topics
// are created: Pub/Sub's fan-out to subscriptions is the service's work,
// and pstest's grows with every message it stores.
func benchPubSub(b *testing.B, top *topology.Topology) (*pubsub.Client, string) {
	b.Helper()
	ctx := context.Background()
	addr, what := "", "the gcloud Pub/Sub emulator"
	if *benchBroker == "emulator" {
		addr = emutest.Host(b, emulator.PubSub)
	}
	if addr == "" {
		bin := filepath.Join(b.TempDir(), "pstest")
		if out, err := exec.Command("go", "build", "-o", bin, "github.com/relaybus/relaybus/internal/cmd/pstest").CombinedOutput(); err != nil {
			b.Fatalf("build pstest: %v\n%s", err, out)
		}
		cmd := exec.Command(bin)
		stdin, _ := cmd.StdinPipe()
		stdout, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = stdin.Close(); _ = cmd.Process.Kill(); _ = cmd.Wait() })
		line, err := bufio.NewReader(stdout).ReadString('\n')
		if err != nil {
			b.Fatal(err)
		}
		addr, what = strings.TrimSpace(line), "pstest in its own process"
	}
	project := fmt.Sprintf("relay-bench-%d", time.Now().UnixNano())
	c, err := pubsub.Dial(ctx, project, addr, pubsub.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close() })
	for _, t := range top.Topics {
		if _, err := c.PubSub().TopicAdminClient.CreateTopic(ctx, topicRequest(project, t.Name)); err != nil {
			b.Fatal(err)
		}
	}
	return c, what
}

func topicRequest(project, topic string) *pb.Topic {
	return &pb.Topic{Name: "projects/" + project + "/topics/" + topic}
}

// heapSampler records the peak of the Go heap (live and not yet swept
// objects, runtime/metrics) while it runs.
type heapSampler struct {
	peak atomic.Uint64
	stop chan struct{}
	done chan struct{}
}

func sampleHeap() *heapSampler {
	h := &heapSampler{stop: make(chan struct{}), done: make(chan struct{})}
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	go func() {
		defer close(h.done)
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			metrics.Read(s)
			if v := s[0].Value.Uint64(); v > h.peak.Load() {
				h.peak.Store(v)
			}
			select {
			case <-t.C:
			case <-h.stop:
				return
			}
		}
	}()
	return h
}

func (h *heapSampler) peakMB() float64 {
	close(h.stop)
	<-h.done
	return float64(h.peak.Load()) / (1 << 20)
}

// sinkPublisher records, per ordering key, the events the broker
// acknowledged, in order, for the run's order check.
type sinkPublisher struct {
	relay.Publisher
	sink *benchcheck.Sink
}

func (p sinkPublisher) PublishBatch(ctx context.Context, topic string, msgs []event.Message) (int, error) {
	n, err := p.Publisher.PublishBatch(ctx, topic, msgs)
	for _, m := range msgs[:n] {
		p.sink.Got(m.OrderingKey, m.Attributes[event.AttrEventID])
	}
	return n, err
}

// drainRun is what one drain benchmark measured and how it ran.
type drainRun struct {
	rate, heapMB float64
	// cpuPerEvent is the process's CPU time (getrusage) during the drain,
	// in µs per event: the relay alone runs then (Pub/Sub is another process).
	cpuPerEvent     float64
	o               relay.Options
	pubsub, durable string
}

// drainBench fills the outbox with versions 1..events/aggregates of each
// aggregate and times a relay draining it.
// A transport (with), when given, replaces benchPubSub.
func drainBench(b *testing.B, events, aggregates int, with ...func(*testing.B, *topology.Topology) (relay.Publisher, string)) (run drainRun) {
	b.Helper()
	ctx := context.Background()
	pool, _ := pgtest.SchemaConfig(b, func(c *pgxpool.Config) { c.MaxConns = 16 })
	if err := outbox.Migrate(ctx, pool); err != nil {
		b.Fatal(err)
	}
	top, err := topology.Load("")
	if err != nil {
		b.Fatal(err)
	}
	var pub relay.Publisher
	var pubsub string
	if len(with) > 0 {
		pub, pubsub = with[0](b, top)
	} else {
		pub, pubsub = benchPubSub(b, top)
	}
	durable := pgtest.RequireDurable(b)
	fill(b, pool, aggregates, int64(events/aggregates))
	// What the outbox holds, per aggregate in version order: what the
	// broker must acknowledge, once each and in that order. The sink
	// keeps running checksums and counts, not the ids: its memory stays
	// out of relay_peak_heap_mb.
	sink := benchcheck.NewSink()
	for v := int64(1); v <= int64(events/aggregates); v++ {
		for a := range aggregates {
			e := ev(aggKey(a), v)
			sink.Sent(e.AggregateID, e.ID)
		}
	}
	pub = sinkPublisher{Publisher: pub, sink: sink}
	if _, err := pool.Exec(ctx, `ANALYZE relaybus_outbox; ANALYZE relaybus_outbox_dispatch`); err != nil { // as autovacuum would have by now
		b.Fatal(err)
	}
	o := relay.Options{DB: pool, Publisher: pub, Topology: top}
	benchTuning(&o)
	r, err := relay.New(o)
	if err != nil {
		b.Fatal(err)
	}
	runtime.GC()
	heap := sampleHeap()
	cpu0, err := cost.CPU()
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
	cpu1, err := cost.CPU()
	if err != nil {
		b.Fatal(err)
	}
	heapMB := heap.peakMB()
	if c, _ := outbox.Count(ctx, pool); published != events || c.Pending != 0 {
		b.Fatalf("published %d, %d pending; want %d", published, c.Pending, events)
	}
	sink.Require(b, "relay drain")
	o = relay.Options{BatchSize: relay.DefaultBatchSize, Aggregates: relay.DefaultAggregates, RunLimit: relay.DefaultRunLimit,
		Concurrency: relay.DefaultConcurrency}
	benchTuning(&o)
	return drainRun{rate: float64(events) / elapsed.Seconds(), heapMB: heapMB,
		cpuPerEvent: float64((cpu1 - cpu0).Microseconds()) / float64(events), o: o, pubsub: pubsub, durable: durable}
}

func benchEvents(def int) int {
	if *benchEventsN > 0 {
		return *benchEventsN
	}
	return def
}

// BenchmarkDrain drains 200,000 queued events on 500 aggregates (400
// versions each) and reports the sustained rate, the relay's peak heap and
// the process's peak resident memory.
func BenchmarkDrain(b *testing.B) {
	for range b.N {
		b.StopTimer()
		events := benchEvents(200_000)
		r := drainBench(b, events, 500)
		o := r.o
		fmt.Printf("# relay drain: %d events on 500 aggregates, %d-byte payloads, batch %d rows, %d aggregates and %d rows of each per claim, %d workers; Postgres %s; %s, topics only, ordering keys\n",
			events, len(`{"n":1}`), o.BatchSize, o.Aggregates, o.RunLimit, o.Concurrency, r.durable, r.pubsub)
		benchcheck.Figure(b, "relay_events_per_s", r.rate, "ev/s")
		fmt.Printf("# relay_peak_heap_mb: the Go heap's objects (runtime/metrics /memory/classes/heap/objects:bytes), sampled every 5 ms during the drain; Pub/Sub's store is in another process\n")
		benchcheck.Figure(b, "relay_peak_heap_mb", r.heapMB, "MB")
		fmt.Printf("# relay_cpu_us_per_event: the benchmark process's user+system CPU (getrusage) during the drain, when only the relay runs in it (Pub/Sub is another process, the outbox was filled before), divided by the events\n")
		benchcheck.Figure(b, "relay_cpu_us_per_event", r.cpuPerEvent, "µs")
		fmt.Printf("# relay_peak_rss_mb: VmHWM of the benchmark process, which also filled the outbox\n")
		benchcheck.Figure(b, "relay_peak_rss_mb", peakRSSMB(), "MB")
	}
}

// BenchmarkDrainPgBouncer drains as BenchmarkDrain does, interleaved
// direct and through PgBouncer in transaction mode (pgx's exec query
// mode, as behind Supabase's pooler), three rounds of each, and reports
// the median pooled rate with the rounds' ratios to the direct ones.
func BenchmarkDrainPgBouncer(b *testing.B) {
	pgtest.PgBouncerURL(b) // skips without one, outside CI
	for range b.N {
		b.StopTimer()
		events := benchEvents(200_000)
		var direct, pooled []float64
		var r drainRun
		for range overheadRounds {
			b.Setenv(pgtest.EnvPooled, "")
			direct = append(direct, drainBench(b, events, 500).rate)
			b.Setenv(pgtest.EnvPooled, "1")
			r = drainBench(b, events, 500)
			pooled = append(pooled, r.rate)
		}
		o := r.o
		benchcheck.Compare(b, "relay_events_per_s_pgbouncer",
			fmt.Sprintf("relay_events_per_s direct → through PgBouncer 1.18 (pool_mode=transaction, default_query_exec_mode=exec), %d events on 500 aggregates per drain, batch %d rows, %d aggregates and %d rows of each per claim, %d workers; Postgres %s; %s",
				events, o.BatchSize, o.Aggregates, o.RunLimit, o.Concurrency, r.durable, r.pubsub), direct, pooled, true)
		benchcheck.Figure(b, "relay_events_per_s_pgbouncer", benchcheck.Median(pooled), "ev/s")
	}
}

// BenchmarkDrainDeep drains 100,000 events on 50 aggregates (2,000
// versions each): long runs per ordering key.
func BenchmarkDrainDeep(b *testing.B) {
	for range b.N {
		b.StopTimer()
		events := benchEvents(100_000)
		r := drainBench(b, events, 50)
		o := r.o
		fmt.Printf("# relay deep drain: %d events on 50 aggregates, batch %d rows, %d aggregates and %d rows of each per claim, %d workers; Postgres %s; %s\n",
			events, o.BatchSize, o.Aggregates, o.RunLimit, o.Concurrency, r.durable, r.pubsub)
		benchcheck.Figure(b, "relay_deep_events_per_s", r.rate, "ev/s")
	}
}

// ackClock wraps the relay's Publisher and notes when Pub/Sub acknowledged
// each event (by its event_id attribute).
type ackClock struct {
	relay.Publisher
	mu    sync.Mutex
	acked map[string]time.Time
}

func (a *ackClock) PublishBatch(ctx context.Context, topic string, msgs []event.Message) (int, error) {
	n, err := a.Publisher.PublishBatch(ctx, topic, msgs)
	now := time.Now()
	a.mu.Lock()
	for _, m := range msgs[:n] {
		a.acked[m.Attributes[event.AttrEventID]] = now
	}
	a.mu.Unlock()
	return n, err
}

// BenchmarkChildPublish measures the post-commit kick: producers commit
// transactions that enqueue one event each, at a fixed rate (open loop),
// and kick them; the latency runs from each commit's return to Pub/Sub's
// acknowledgement of its event.
func BenchmarkChildPublish(b *testing.B) {
	const (
		rate     = 500
		duration = 10 * time.Second
		warmup   = 200
	)
	ctx := context.Background()
	for range b.N {
		b.StopTimer()
		pool, _ := pgtest.SchemaConfig(b, func(c *pgxpool.Config) { c.MaxConns = 32 })
		if err := outbox.Migrate(ctx, pool); err != nil {
			b.Fatal(err)
		}
		top, err := topology.Load("")
		if err != nil {
			b.Fatal(err)
		}
		pub, pubsub := benchPubSub(b, top)
		durable := pgtest.RequireDurable(b)
		clock := &ackClock{Publisher: pub, acked: map[string]time.Time{}}
		r, err := relay.New(relay.Options{DB: pool, Publisher: clock, Topology: top})
		if err != nil {
			b.Fatal(err)
		}
		total := int(duration.Seconds()*rate) + warmup
		committed := make([]time.Time, total)
		ids := make([]string, total)
		var failed atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for i := range total {
			at := start.Add(time.Duration(i) * time.Second / rate)
			time.Sleep(time.Until(at))
			wg.Add(1)
			go func() {
				defer wg.Done()
				e := ev(fmt.Sprintf("member-%d-%d", start.UnixNano(), i), 1)
				tx, err := pool.Begin(ctx)
				if err == nil {
					_, err = outbox.Enqueue(ctx, tx, e)
				}
				if err == nil {
					err = tx.Commit(ctx)
				}
				if err != nil {
					failed.Add(1)
					return
				}
				committed[i], ids[i] = time.Now(), e.ID
				r.Kick(e.ID)
			}()
		}
		wg.Wait()
		if err := r.FlushKicks(ctx); err != nil {
			b.Fatal(err)
		}
		var lat []float64
		late := 0
		clock.mu.Lock()
		for i := warmup; i < total; i++ {
			if ids[i] == "" {
				continue
			}
			if a, ok := clock.acked[ids[i]]; ok {
				lat = append(lat, float64(a.Sub(committed[i]).Microseconds())/1000)
			} else {
				late++
			}
		}
		clock.mu.Unlock()
		_ = r.Close(ctx)
		if late > 0 || failed.Load() > 0 {
			b.Fatalf("child publish: %d events not published by their kick, %d transactions failed: the run prints no figure", late, failed.Load())
		}
		slices.Sort(lat)
		pct := func(p float64) float64 { return percentile.Sorted(lat, p) }
		fmt.Printf("# child publish: %d transactions at %d/s open loop (after %d warm-up), one event each (its own aggregate), kicked after commit; commit -> Pub/Sub ack over all %d events; Postgres %s; %s; p50 %.2f ms, p90 %.2f ms, max %.2f ms\n",
			total-warmup, rate, warmup, len(lat), durable, pubsub, pct(0.5), pct(0.9), lat[len(lat)-1])
		benchcheck.Figure(b, "child_publish_p99_ms", pct(0.99), "ms")
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
