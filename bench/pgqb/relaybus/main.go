// Command relaybus is relaybus's adapter for the public Postgres-queue
// harness (github.com/hardbyte/postgresql-job-queue-benchmarking): a
// long-running process that speaks the harness's JSONL contract
// (CONTRIBUTING_ADAPTERS.md there) for its long_horizon scenario.
//
// Each "job" is one event of an aggregate of its own, so the harness's jobs
// map onto relaybus's path end to end:
//
//   - producers enqueue the events the harness asks for through shared/outbox,
//     one transaction per batch, and kick the relay after the commit
//     (relay.KickIn); a background drain publishes whatever a kick missed;
//   - the relay publishes to NATS JetStream, embedded in this process;
//   - the pull worker pulls the subscription with WORKER_COUNT deliveries in
//     flight and hands each to the consume engine (shared/consumer), which
//     claims the event in the inbox and runs the handler in one Postgres
//     transaction: the handler records the event in relaybus_bench_handled
//     and does JOB_WORK_MS of synthetic work.
//
// Claim latency is the event's enqueue (its OccurredAt, set just before the
// insert) to the handler's start; a completion is a committed delivery.
//
// Pacing: with PRODUCER_PACING=harness (the harness's default) the producer
// enqueues what the harness's "ENQUEUE <n>" lines on stdin ask for; with
// PRODUCER_PACING=adapter it paces itself at PRODUCER_RATE, crediting real
// elapsed time. PRODUCER_MODE=depth-target is refused.
//
// stdout carries the JSONL records only; logs go to stderr.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"

	"github.com/relaybus/relaybus/internal/delivery"
	"github.com/relaybus/relaybus/internal/inbox"
	"github.com/relaybus/relaybus/internal/migrate"
	"github.com/relaybus/relaybus/internal/percentile"
	"github.com/relaybus/relaybus/internal/pull"
	"github.com/relaybus/relaybus/shared/broker/nats"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/projection"
	"github.com/relaybus/relaybus/shared/relay"
)

// The adapter's names: the harness's system key, the topic the jobs go
// through and the subscription the consumer pulls.
const (
	system       = "relaybus"
	topic        = "bench.jobs"
	subscription = "bench-worker"
	eventType    = "bench.job.enqueued"
	consumerID   = "bench-worker"
)

// eventTables are the tables the harness watches for bloat (adapter.json's
// event_tables; the descriptor repeats them).
var eventTables = []string{
	"public.relaybus_outbox",
	"public.relaybus_outbox_dispatch",
	"public.relaybus_inbox",
	"public.relaybus_inbox_attempts",
	"public.relaybus_bench_handled",
}

// config is the harness's environment, read once.
type config struct {
	databaseURL  string
	scenario     string
	pacing       string
	rate         int
	batchMax     int
	batchMs      int
	workers      int
	payloadBytes int
	workMs       int
	sampleEvery  time.Duration
	instance     int
}

func main() {
	// Warnings and errors only: the engine logs every delivery at INFO.
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	cfg, err := readConfig(os.Getenv)
	if err != nil {
		log.Error("relaybus adapter: " + err.Error())
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, os.Stdin, os.Stdout, log); err != nil {
		log.Error("relaybus adapter: " + err.Error())
		os.Exit(1)
	}
}

// readConfig reads the harness's variables, with the contract's defaults.
func readConfig(getenv func(string) string) (config, error) {
	c := config{
		databaseURL: getenv("DATABASE_URL"),
		scenario:    or(getenv("SCENARIO"), "long_horizon"),
		pacing:      or(getenv("PRODUCER_PACING"), "harness"),
	}
	if c.databaseURL == "" {
		return c, errors.New("DATABASE_URL is required")
	}
	if c.scenario != "long_horizon" {
		return c, fmt.Errorf("SCENARIO %q: only long_horizon is implemented", c.scenario)
	}
	if m := or(getenv("PRODUCER_MODE"), "fixed"); m != "fixed" {
		return c, fmt.Errorf("PRODUCER_MODE %q: only fixed is implemented", m)
	}
	if c.pacing != "harness" && c.pacing != "adapter" {
		return c, fmt.Errorf("PRODUCER_PACING %q: must be harness or adapter", c.pacing)
	}
	ints := []struct {
		name     string
		def, min int
		dst      *int
	}{
		{"PRODUCER_RATE", 800, 0, &c.rate},
		{"PRODUCER_BATCH_MAX", 128, 1, &c.batchMax},
		{"PRODUCER_BATCH_MS", 25, 1, &c.batchMs},
		{"WORKER_COUNT", 32, 1, &c.workers},
		{"JOB_PAYLOAD_BYTES", 256, 0, &c.payloadBytes},
		{"JOB_WORK_MS", 1, 0, &c.workMs},
		{"BENCH_INSTANCE_ID", 0, 0, &c.instance},
	}
	for _, v := range ints {
		*v.dst = v.def
		if s := getenv(v.name); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < v.min {
				return c, fmt.Errorf("%s %q: must be an integer of at least %d", v.name, s, v.min)
			}
			*v.dst = n
		}
	}
	every := 5
	if s := getenv("SAMPLE_EVERY_S"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return c, fmt.Errorf("SAMPLE_EVERY_S %q: must be a whole number of seconds, at least 1", s)
		}
		every = n
	}
	c.sampleEvery = time.Duration(every) * time.Second
	return c, nil
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// run is the adapter: it returns once ctx ends and everything has stopped.
func run(ctx context.Context, cfg config, stdin io.Reader, stdout io.Writer, log *slog.Logger) error {
	out := &emitter{w: stdout, instance: cfg.instance}
	pool, err := pgxpool.New(ctx, cfg.databaseURL)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer pool.Close()
	for _, l := range []migrate.Line{outbox.Migrations, inbox.Migrations, projection.Migrations} {
		if _, err := l.Apply(ctx, pool); err != nil {
			return fmt.Errorf("migrate %s: %w", l.Name, err)
		}
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS relaybus_bench_handled (
		event_id text NOT NULL, handled_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return fmt.Errorf("create relaybus_bench_handled: %w", err)
	}
	out.emit(map[string]any{
		"kind": "descriptor", "system": system, "event_tables": eventTables, "extensions": []string{},
		"version": "relaybus (NATS JetStream)", "schema_version": "outbox+inbox migrations", "db_name": dbName(cfg.databaseURL),
		"started_at": stamp(time.Now()),
	})

	// The broker: JetStream in this process, storing in a directory of its own.
	dir, err := os.MkdirTemp("", "relaybus-bench-nats-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoSigs: true})
	if err != nil {
		return fmt.Errorf("nats server: %w", err)
	}
	ns.Start()
	defer ns.Shutdown()
	if !ns.ReadyForConnections(10 * time.Second) {
		return errors.New("nats server: not ready within 10s")
	}
	bus, err := nats.Connect(ctx, ns.ClientURL(), nats.Options{Name: "relaybus-bench"})
	if err != nil {
		return err
	}
	defer func() { _ = bus.Close() }()
	if err := bus.EnsureTopic(ctx, topic, 0); err != nil {
		return err
	}
	if err := bus.EnsureSubscription(ctx, topic, subscription, nats.SubscriptionConfig{}); err != nil {
		return err
	}

	rl, err := relay.New(relay.Options{DB: pool, Publisher: bus, Logger: log})
	if err != nil {
		return err
	}
	st := newStats(30*time.Second, 1<<16)
	mux := consumer.NewMux()
	work := time.Duration(cfg.workMs) * time.Millisecond
	mux.RegisterFunc(eventType, "v1", func(ctx context.Context, c *consumer.Context) error {
		st.claimed(time.Since(c.Event.OccurredAt))
		if _, err := c.Tx.Exec(ctx, `INSERT INTO relaybus_bench_handled (event_id) VALUES ($1)`, c.Event.ID); err != nil {
			return err
		}
		if work > 0 {
			time.Sleep(work) // the contract's synthetic job work
		}
		return nil
	})
	eng, err := consumer.New(consumer.Options{DB: pool, ConsumerID: consumerID, Subscription: subscription, Handler: mux,
		DeadLetters: bus, Logger: log})
	if err != nil {
		return err
	}
	w, err := pull.New(pull.Options{Source: bus, Subscription: subscription, Engine: engineAnswer{eng, st}, DeadLetters: bus,
		MaxInFlight: cfg.workers, Logger: log})
	if err != nil {
		return err
	}

	// Everything below stops when ctx ends (SIGTERM).
	var wg sync.WaitGroup
	// The worker and drain stop a moment after the producer, on their own
	// context, so what the producer committed last is still delivered.
	bg, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBG()
	wg.Go(func() {
		if err := w.Run(bg); err != nil {
			log.Error("pull worker: " + err.Error())
		}
	})
	wg.Go(func() { drainLoop(bg, rl, log) })
	samplerDone := make(chan struct{})
	go func() { defer close(samplerDone); sample(ctx, cfg, st, out) }()

	p := &producer{pool: pool, relay: rl, st: st, padding: strings.Repeat("x", max(0, cfg.payloadBytes-32)),
		prefix: "i" + strconv.Itoa(cfg.instance) + "-" + strconv.FormatInt(time.Now().UnixNano(), 36), log: log}
	if cfg.pacing == "harness" {
		p.fromTokens(ctx, stdin, cfg.batchMax)
	} else {
		p.paced(ctx, cfg.rate, cfg.batchMax, time.Duration(cfg.batchMs)*time.Millisecond)
	}
	<-ctx.Done()
	<-samplerDone
	fmt.Fprintln(os.Stderr, "[relaybus] shutdown signal received")
	// The harness waits 10 s before killing; leave the worker ~3 s.
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Second)
	defer cancel()
	_ = rl.FlushKicks(stopCtx)
	stopBG()
	wg.Wait()
	return rl.Close(stopCtx)
}

// engineAnswer runs the consume engine for the pull worker and counts
// the deliveries it committed.
type engineAnswer struct {
	e  *consumer.Engine
	st *stats
}

func (a engineAnswer) Handle(ctx context.Context, d delivery.Delivery) pull.Answer {
	r := a.e.Handle(ctx, d)
	if r.Status == 200 && !r.Duplicate && !r.Ignored {
		a.st.completed.Add(1)
	}
	return pull.Answer{Status: r.Status, Attempt: r.Attempt, EventID: r.EventID, Code: r.Code, Error: r.Error}
}

// drainLoop publishes what no kick did (a kick that lost its lease, a
// publish that failed): once a second, as a deployment's scheduled relay.
func drainLoop(ctx context.Context, rl *relay.Relay, log *slog.Logger) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if _, err := rl.Drain(ctx, 900*time.Millisecond); err != nil && ctx.Err() == nil {
				log.Error("drain: " + err.Error())
			}
		}
	}
}

// producer enqueues the harness's jobs through the outbox.
type producer struct {
	pool    *pgxpool.Pool
	relay   *relay.Relay
	st      *stats
	padding string
	prefix  string
	seq     int64
	log     *slog.Logger
}

// fromTokens enqueues n events for every "ENQUEUE <n>" line on r, until ctx
// ends or r does, at most batchMax in one transaction.
func (p *producer) fromTokens(ctx context.Context, r io.Reader, batchMax int) {
	lines := make(chan int, 1024)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) != 2 || f[0] != "ENQUEUE" {
				continue
			}
			if n, err := strconv.Atoi(f[1]); err == nil && n > 0 {
				select {
				case lines <- n:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case n, ok := <-lines:
			if !ok {
				return
			}
			// Tokens that arrived while the last transaction ran join
			// this one, so a slow commit delays the offered load, never
			// drops it (as the harness's own pacer carries its credit).
			for more := true; more && n < batchMax; {
				select {
				case k, ok := <-lines:
					n += k
					more = ok
				default:
					more = false
				}
			}
			for n > 0 && ctx.Err() == nil {
				k := min(n, batchMax)
				p.enqueue(ctx, k)
				n -= k
			}
		}
	}
}

// paced enqueues rate events a second on its own clock: every period it
// credits rate × the real time elapsed and enqueues the whole part.
func (p *producer) paced(ctx context.Context, rate, batchMax int, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	last := time.Now()
	credit := 0.0
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			credit += float64(rate) * now.Sub(last).Seconds()
			last = now
			for credit >= 1 && ctx.Err() == nil {
				k := min(int(credit), batchMax)
				p.enqueue(ctx, k)
				credit -= float64(k)
			}
		}
	}
}

// enqueue writes n events in one transaction and kicks them after it
// commits. A failure is logged and the batch not counted.
func (p *producer) enqueue(ctx context.Context, n int) {
	now := time.Now()
	evs := make([]*event.Event, n)
	ids := make([]string, n)
	for i := range evs {
		p.seq++
		id := p.prefix + "-" + strconv.FormatInt(p.seq, 10)
		evs[i] = &event.Event{ID: id, Type: eventType, Topic: topic, Source: "pgqb-harness", SchemaVersion: "v1",
			AggregateType: "job", AggregateID: id, Version: 1, OccurredAt: now,
			Payload: []byte(`{"seq":` + strconv.FormatInt(p.seq, 10) + `,"padding":"` + p.padding + `"}`)}
		ids[i] = id
	}
	err := func() error {
		tx, err := p.pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		if _, err := outbox.Enqueue(ctx, tx, evs...); err != nil {
			return err
		}
		kick, err := p.relay.KickIn(ctx, tx, ids...)
		if err != nil {
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		kick()
		return nil
	}()
	if err != nil {
		if ctx.Err() == nil {
			p.log.Error("producer: enqueue: " + err.Error())
		}
		return
	}
	p.st.enqueued.Add(uint64(n))
}

// stats are the adapter's counters and its window of claim latencies.
type stats struct {
	enqueued, claimedN, completed atomic.Uint64

	mu     sync.Mutex
	window time.Duration
	ring   []claim // bounded: the oldest are overwritten
	next   int
	full   bool
}

type claim struct {
	at      time.Time
	latency time.Duration
}

func newStats(window time.Duration, capacity int) *stats {
	return &stats{window: window, ring: make([]claim, capacity)}
}

func (s *stats) claimed(d time.Duration) {
	s.claimedN.Add(1)
	s.mu.Lock()
	s.ring[s.next] = claim{at: time.Now(), latency: max(d, 0)}
	s.next++
	if s.next == len(s.ring) {
		s.next, s.full = 0, true
	}
	s.mu.Unlock()
}

// percentiles are the nearest-rank p50, p95 and p99 of the claims within
// the window, in milliseconds (zeros when there were none).
func (s *stats) percentiles(now time.Time) (p50, p95, p99 float64) {
	cutoff := now.Add(-s.window)
	s.mu.Lock()
	n := s.next
	if s.full {
		n = len(s.ring)
	}
	ms := make([]float64, 0, n)
	for _, c := range s.ring[:n] {
		if c.at.After(cutoff) {
			ms = append(ms, float64(c.latency.Microseconds())/1000)
		}
	}
	s.mu.Unlock()
	if len(ms) == 0 {
		return 0, 0, 0
	}
	return percentile.Of(ms, 0.50), percentile.Of(ms, 0.95), percentile.Of(ms, 0.99)
}

// sample emits the required metrics every cfg.sampleEvery, aligned to the
// wall clock's multiples of it, until ctx ends, then once more.
func sample(ctx context.Context, cfg config, st *stats, out *emitter) {
	next := time.Now().Truncate(cfg.sampleEvery).Add(cfg.sampleEvery)
	t := time.NewTimer(time.Until(next))
	defer t.Stop()
	last, lastEnq, lastDone := time.Now(), st.enqueued.Load(), st.completed.Load()
	for {
		final := false
		select {
		case <-ctx.Done():
			final = true
		case <-t.C:
			next = next.Add(cfg.sampleEvery)
			t.Reset(time.Until(next))
		}
		now := time.Now()
		dt := max(now.Sub(last).Seconds(), 0.001)
		enq, done := st.enqueued.Load(), st.completed.Load()
		p50, p95, p99 := st.percentiles(now)
		every := cfg.sampleEvery.Seconds()
		metrics := []struct {
			name          string
			value, window float64
		}{
			{"claim_p50_ms", p50, 30},
			{"claim_p95_ms", p95, 30},
			{"claim_p99_ms", p99, 30},
			{"enqueue_rate", float64(enq-lastEnq) / dt, every},
			{"completion_rate", float64(done-lastDone) / dt, every},
			{"queue_depth", float64(max(int64(enq)-int64(st.claimedN.Load()), 0)), 0},
			{"producer_target_rate", float64(cfg.rate), 0},
		}
		last, lastEnq, lastDone = now, enq, done
		ts := stamp(now)
		for _, m := range metrics {
			if cfg.instance != 0 && (m.name == "queue_depth" || m.name == "producer_target_rate") {
				continue // observer metrics: instance 0 reports them for all
			}
			out.emit(map[string]any{"t": ts, "system": system, "kind": "adapter", "subject_kind": "adapter",
				"subject": "", "metric": m.name, "value": m.value, "window_s": m.window})
		}
		if final {
			return
		}
	}
}

// emitter writes one JSON record a line.
type emitter struct {
	mu       sync.Mutex
	w        io.Writer
	instance int
}

func (e *emitter) emit(rec map[string]any) {
	rec["instance_id"] = e.instance
	b, err := json.Marshal(rec)
	if err != nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	_, _ = e.w.Write(append(b, '\n'))
}

func stamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

func dbName(raw string) string {
	if u, err := url.Parse(raw); err == nil {
		if n := strings.TrimPrefix(u.Path, "/"); n != "" {
			return n
		}
	}
	return system + "_bench"
}
