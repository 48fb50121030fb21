package history_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relaybus/relaybus/internal/benchcheck"
	"github.com/relaybus/relaybus/internal/cost"
	"github.com/relaybus/relaybus/internal/delivery"
	"github.com/relaybus/relaybus/internal/history"
	"github.com/relaybus/relaybus/internal/inbox"
	"github.com/relaybus/relaybus/internal/migrate"
	"github.com/relaybus/relaybus/internal/pack"
	"github.com/relaybus/relaybus/internal/percentile"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/internal/pubsubtest"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/projection"
	"github.com/relaybus/relaybus/shared/relay"
	"github.com/relaybus/relaybus/shared/topology"
)

// The benchmarks' history: 200,000 events on 500 aggregates (400 versions
// each), published before the consumer existed and moved to the history.
const (
	benchAggregates = 500
	benchVersions   = 400
	// benchLive live versions of every aggregate are published while the
	// backfill runs (after its watermark), one round of all aggregates
	// every benchLiveEvery.
	benchLive      = 10
	benchLiveEvery = 200 * time.Millisecond
	// benchWorkers take the consumer's deliveries, each ordering key on
	// one of them, as an ordered subscription hands them out: consume's
	// concurrency, on a pool of benchPool connections (consume's default
	// pool is 32 for 16 pushes at once).
	benchWorkers = 16
	benchPool    = 16
	// liveConsumer is another consumer of the topic, live all along: it
	// takes the live versions and a steady stream of benchSteadyRate
	// events/s on benchSteadyAggregates aggregates of its own, never the
	// backfill. Its handler latency is measured for benchQuiet before the
	// backfill starts and again while it runs.
	liveConsumer          = "live-service"
	liveWorkers           = 4
	benchSteadyRate       = 100
	benchSteadyAggregates = 50
	benchQuiet            = 15 * time.Second
)

// discard is a broker that acknowledges everything: the setup's relay
// "publishes" the history with it before the consumer exists.
type discard struct{}

func (discard) PublishBatch(_ context.Context, _ string, msgs []event.Message) (int, error) {
	return len(msgs), nil
}

// tap publishes to the broker and hands every message the broker
// acknowledged to out, in the order it was acknowledged.
type tap struct {
	next relay.Publisher
	out  func([]event.Message)
}

func (t tap) PublishBatch(ctx context.Context, topic string, msgs []event.Message) (int, error) {
	n, err := t.next.PublishBatch(ctx, topic, msgs)
	t.out(msgs[:n])
	return n, err
}

// requests counts the Publish RPCs the broker (pstest) received and the
// messages in them.
type requests struct{ calls, msgs atomic.Int64 }

func (r *requests) React(req any) (bool, any, error) {
	if pr, ok := req.(*pb.PublishRequest); ok {
		r.msgs.Add(int64(len(pr.GetMessages())))
	}
	r.calls.Add(1)
	return false, nil, nil
}

// benchBroker is pstest with the topic alone: the benchmark's consumer
// takes each message as the broker acknowledged it (tap), so no
// subscription holds the run's messages (pstest's delivery loop walks
// every message a subscription holds, a cost of the fake, not of relaybus).
func benchBroker(b *testing.B) (*pubsubtest.Fake, *requests) {
	b.Helper()
	reqs := &requests{}
	fake := pubsubtest.New(b, pstest.ServerReactorOption{FuncName: "Publish", Reactor: reqs})
	if _, err := fake.Server.GServer.CreateTopic(context.Background(), &pb.Topic{Name: "projects/" + pubsubtest.Project + "/topics/" + topic}); err != nil {
		b.Fatal(err)
	}
	return fake, reqs
}

// benchHistory creates a database of its own with the outbox and fills
// its history: n aggregates × v versions of topic, published (by a relay
// into a broker that acknowledges everything) and moved to the history by
// retention, as before a consumer that joins late.
func benchHistory(b *testing.B, aggregates, versions int) (*pgxpool.Pool, string, *topology.Topology) {
	b.Helper()
	ctx := context.Background()
	url := pgtest.Database(b)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 16
	db, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(db.Close)
	if err := outbox.Migrate(ctx, db); err != nil {
		b.Fatal(err)
	}
	top := joined(b)
	const chunk = 2000
	var evs []*event.Event
	flush := func() {
		if _, err := outbox.Enqueue(ctx, db, evs...); err != nil {
			b.Fatal(err)
		}
		evs = evs[:0]
	}
	for a := range aggregates {
		for v := 1; v <= versions; v++ {
			evs = append(evs, benchEvent(a, int64(v)))
			if len(evs) == chunk {
				flush()
			}
		}
	}
	if len(evs) > 0 {
		flush()
	}
	setup, err := relay.New(relay.Options{DB: db, Publisher: discard{}, Topology: top, Retention: -1})
	if err != nil {
		b.Fatal(err)
	}
	defer setup.Close(ctx)
	for {
		sum, err := setup.Drain(ctx, time.Minute)
		if err != nil {
			b.Fatal(err)
		}
		if sum.Remaining == 0 {
			break
		}
	}
	for {
		n, err := outbox.PurgeWith(ctx, db, outbox.PurgeOptions{Before: time.Now().Add(time.Minute), Limit: 20000,
			History: outbox.History{Default: 24 * time.Hour}})
		if err != nil {
			b.Fatal(err)
		}
		if n == 0 {
			break
		}
	}
	var kept int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM relaybus_outbox_history`).Scan(&kept); err != nil || kept != aggregates*versions {
		b.Fatalf("history holds %d events (%v), want %d", kept, err, aggregates*versions)
	}
	if _, err := db.Exec(ctx, `ANALYZE`); err != nil {
		b.Fatal(err)
	}
	return db, url, top
}

// eventsIn is how many events m carries: a pack's count, else 1.
func eventsIn(m event.Message) int {
	if n, err := strconv.Atoi(m.Attributes[pack.Attr]); err == nil {
		return n
	}
	return 1
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// deadLetters refuses every dead letter: the benchmark's consumer has none
// to send (a delivery that would be dead-lettered fails the run).
type deadLetters struct{}

func (deadLetters) Publish(context.Context, string, event.Message) (string, error) {
	return "", errors.New("the benchmark's consumer dead-letters nothing")
}

// benchConsumer is the backfilled consumer: the consume engine running a
// strict handler that records each version it applies, on a schema of its
// own in the test database with benchPool connections.
func benchConsumer(b *testing.B) (*pgxpool.Pool, *consumer.Engine) {
	return benchEngine(b, newbie, benchPool, projection.Strict(recorder()))
}

// benchEngine is consumer id's engine with handler h, on a schema of its
// own in the test database with pool connections.
func benchEngine(b *testing.B, id string, pool int32, h consumer.Handler) (*pgxpool.Pool, *consumer.Engine) {
	b.Helper()
	ctx := context.Background()
	db, _ := pgtest.SchemaConfig(b, func(c *pgxpool.Config) { c.MaxConns = pool })
	for _, l := range []migrate.Line{inbox.Migrations, projection.Migrations, outbox.Migrations} {
		if _, err := l.Apply(ctx, db); err != nil {
			b.Fatal(err)
		}
	}
	if err := applied(ctx, db); err != nil {
		b.Fatal(err)
	}
	eng, err := consumer.New(consumer.Options{DB: db, ConsumerID: id, Handler: h, DeadLetters: deadLetters{}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = eng.Close(context.Background()) })
	return db, eng
}

func benchEvent(a int, v int64) *event.Event {
	agg := fmt.Sprintf("o-%03d", a)
	return &event.Event{ID: fmt.Sprintf("%s-v%d", agg, v), Type: "order.purchased", Source: "order-service",
		Topic: topic, AggregateID: agg, Version: v, Payload: []byte(fmt.Sprintf(`{"order":%q,"v":%d}`, agg, v))}
}

// BenchmarkBackfill backfills one consumer from a history of 200,000
// events on 500 aggregates while live versions of the same aggregates are
// published past its watermark: the backfill queues its events at its
// highest rate, a relay publishes them (re-pushes addressed to the
// consumer, an aggregate's consecutive ones in packs of up to
// relay.DefaultMaxPack) and the live versions to pstest, and the consume
// engine takes each message the broker acknowledged through a strict
// handler that records the versions it applies (inbox, version gate, one
// Postgres transaction per delivery, a pack's events together), each
// ordering key on one of 16 workers.
//
// Another consumer of the topic (liveConsumer, the generic projection)
// takes the live versions and a steady stream of its own aggregates,
// first for benchQuiet with no backfill, then while the backfill runs;
// consume_p99_ms_without_backfill and consume_p99_ms_during_backfill are
// its handler's p99 in the two phases.
//
// backfill_events_per_s is the history's events over the time from the
// backfill's first step to the consumer's commit of the last event;
// backfill_seam_reorders counts the versions applied after a later
// version of their aggregate. Every aggregate must have applied each of
// its versions once, in order, or the run prints no figure.
func BenchmarkBackfill(b *testing.B) {
	for range b.N {
		backfillBench(b)
	}
}

func backfillBench(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	durable := pgtest.RequireDurable(b)
	db, url, top := benchHistory(b, benchAggregates, benchVersions)
	const historyN = benchAggregates * benchVersions
	total := historyN + benchAggregates*benchLive

	cdb, eng := benchConsumer(b)
	fake, reqs := benchBroker(b)

	// The live consumer: its handler latency before the backfill (phase
	// 0) and while it runs (phase 1); a delivery that spans a phase change
	// is left out.
	ldb, liveEng := benchEngine(b, liveConsumer, liveWorkers, projection.Latest())
	var (
		phase      atomic.Int32
		latMu      sync.Mutex
		lat        [2][]time.Duration
		liveFailed atomic.Int64
		liveWG     sync.WaitGroup
		liveIn     = make([]chan event.Message, liveWorkers)
	)
	for i := range liveIn {
		liveIn[i] = make(chan event.Message, 1<<16)
		liveWG.Add(1)
		go func() {
			defer liveWG.Done()
			for m := range liveIn[i] {
				p := phase.Load()
				t0 := time.Now()
				r := liveEng.Handle(ctx, delivery.Delivery{Mode: delivery.ModePush, Subscription: topic + "." + liveConsumer + "-sub", Message: m})
				d := time.Since(t0)
				if r.Status != 200 || r.Error != "" {
					liveFailed.Add(1)
					continue
				}
				if p < 2 && phase.Load() == p {
					latMu.Lock()
					lat[p] = append(lat[p], d)
					latMu.Unlock()
				}
			}
		}()
	}

	// The consumer: each acknowledged message to the worker of its key.
	var (
		done, failed     atomic.Int64
		backfilledAcked  atomic.Int64
		lastBackfillAck  atomic.Int64
		finished         = make(chan struct{})
		finishOnce       sync.Once
		workers          = make([]chan event.Message, benchWorkers)
		wg               sync.WaitGroup
		firstFailureOnce sync.Once
		firstFailure     string
	)
	for i := range workers {
		workers[i] = make(chan event.Message, total)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for m := range workers[i] {
				r := eng.Handle(ctx, delivery.Delivery{Mode: delivery.ModePush, Subscription: topic + "." + newbie + "-sub", Message: m})
				if r.Status != 200 || r.Error != "" {
					failed.Add(1)
					firstFailureOnce.Do(func() { firstFailure = fmt.Sprintf("%s: %+v", m.Attributes[event.AttrEventID], r) })
				}
				if done.Add(int64(eventsIn(m))) == int64(total) {
					finishOnce.Do(func() { close(finished) })
				}
			}
		}()
	}
	var seq atomic.Int64
	out := func(msgs []event.Message) {
		for _, m := range msgs {
			m.Topic, m.DeliveryAttempt, m.PublishTime = topic, 1, time.Now()
			m.ID = fmt.Sprintf("m-%d", seq.Add(1))
			if m.Attributes[topology.TargetConsumerAttr] != "" {
				backfilledAcked.Add(1)
				lastBackfillAck.Store(time.Now().UnixNano())
			}
			h := fnv.New32a()
			h.Write([]byte(m.OrderingKey))
			k := h.Sum32()
			switch {
			case m.Attributes[topology.TargetConsumerAttr] != "": // the backfill: the newbie's alone
				workers[k%benchWorkers] <- m
			case strings.HasPrefix(m.Attributes[event.AttrAggregateID], "s-"): // the steady stream: a filter keeps it from the newbie
				liveIn[k%liveWorkers] <- m
			default: // a live version: both consumers
				workers[k%benchWorkers] <- m
				liveIn[k%liveWorkers] <- m
			}
		}
	}
	r, err := relay.New(relay.Options{DB: db, Publisher: tap{next: fake.Client, out: out}, Topology: top, Retention: -1})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close(context.Background())

	// The consumer subscribed: the watermark. Its backfill is created.
	spec := history.Spec{Topic: topic, Consumer: newbie, Since: time.Now().Add(-24 * time.Hour), Until: time.Now(), Rate: history.MaxRate, By: "bench"}
	id := history.NewID(time.Now())
	bf, err := history.Start(ctx, db, id, spec)
	if err != nil || bf.Matched != historyN {
		b.Fatalf("start: matched %d (%v), want %d", bf.Matched, err, historyN)
	}

	var (
		bg         sync.WaitGroup
		queuedAt   time.Time
		runErr     error
		liveErr    error
		steadyErr  error
		relayErr   error
		steadySent atomic.Int64
		stopRelay  = make(chan struct{})
		startRun   = make(chan struct{})
		runDone    = make(chan struct{})
		liveDone   = make(chan struct{})
		steadyDone = make(chan struct{})
		relayedAt  time.Time
	)
	bg.Add(4)
	go func() { // the steady stream, for the live consumer, until the newbie is done
		defer bg.Done()
		defer close(steadyDone)
		const every = 50 * time.Millisecond
		t := time.NewTicker(every)
		defer t.Stop()
		per := int(benchSteadyRate * every / time.Second)
		for n := 0; ; {
			evs := make([]*event.Event, 0, per)
			for range per {
				agg := fmt.Sprintf("s-%03d", n%benchSteadyAggregates)
				v := int64(n/benchSteadyAggregates + 1)
				evs = append(evs, &event.Event{ID: fmt.Sprintf("%s-v%d", agg, v), Type: "order.purchased", Source: "order-service",
					Topic: topic, AggregateID: agg, Version: v, Payload: []byte(fmt.Sprintf(`{"order":%q,"v":%d}`, agg, v))})
				n++
			}
			if _, steadyErr = outbox.Enqueue(ctx, db, evs...); steadyErr != nil {
				return
			}
			steadySent.Add(int64(per))
			select {
			case <-ctx.Done():
				return
			case <-finished:
				return
			case <-t.C:
			}
		}
	}()
	var start time.Time
	var cpu0 time.Duration
	var stmts0 cost.Snapshot
	go func() { // the backfill, driven at its rate, after the quiet phase
		defer bg.Done()
		defer close(runDone)
		select {
		case <-ctx.Done():
			return
		case <-startRun:
		}
		var end history.Backfill
		end, runErr = history.Run(ctx, db, id, time.Now().Add(10*time.Minute))
		if runErr == nil && (end.State != history.StateDone || end.Queued != historyN) {
			runErr = fmt.Errorf("backfill ended %s with %d of %d queued", end.State, end.Queued, historyN)
		}
		queuedAt = time.Now()
	}()
	go func() { // live versions past the watermark
		defer bg.Done()
		defer close(liveDone)
		select {
		case <-ctx.Done():
			return
		case <-startRun:
		}
		t := time.NewTicker(benchLiveEvery)
		defer t.Stop()
		for v := int64(benchVersions + 1); v <= benchVersions+benchLive; v++ {
			evs := make([]*event.Event, 0, benchAggregates)
			for a := range benchAggregates {
				evs = append(evs, benchEvent(a, v))
			}
			if _, liveErr = outbox.Enqueue(ctx, db, evs...); liveErr != nil {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	go func() { // the relay, draining whenever there is work
		defer bg.Done()
		idle := time.NewTicker(5 * time.Millisecond)
		defer idle.Stop()
		for {
			sum, err := r.Drain(ctx, 10*time.Second)
			if err != nil {
				relayErr = err
				return
			}
			if sum.Claimed+sum.Repushed > 0 {
				continue
			}
			if isClosed(runDone) && isClosed(liveDone) && isClosed(steadyDone) && sum.Remaining == 0 {
				var left int
				if relayErr = db.QueryRow(ctx, `SELECT count(*) FROM relaybus_outbox_repush`).Scan(&left); relayErr != nil || left == 0 {
					relayedAt = time.Now() // everything queued is published: the relay's part is done
					return
				}
			}
			select {
			case <-stopRelay:
				return
			case <-ctx.Done():
				return
			case <-idle.C: // poll for the backfill's next batch
			}
		}
	}()
	// The quiet phase: the live consumer alone, with no backfill.
	select {
	case <-time.After(benchQuiet):
	case <-ctx.Done():
	}
	if stmts0, err = cost.StatementSnapshot(ctx, url); err != nil {
		b.Fatal(err)
	}
	if cpu0, err = cost.CPU(); err != nil {
		b.Fatal(err)
	}
	start = time.Now()
	phase.Store(1)
	close(startRun)
	cut := false
	select {
	case <-finished:
	case <-time.After(30 * time.Minute):
		cut = true
		cancel()
	}
	elapsed := time.Since(start)
	phase.Store(2)
	bg.Wait() // the steady stream stops at finished; the relay publishes what is left of it
	close(stopRelay)
	cpu1, _ := cost.CPU()
	stmts1, _ := cost.StatementSnapshot(context.Background(), url)
	for _, w := range workers {
		close(w)
	}
	wg.Wait()
	for _, w := range liveIn {
		close(w)
	}
	liveWG.Wait()
	for _, err := range []error{runErr, liveErr, steadyErr, relayErr} {
		if err != nil {
			b.Fatalf("backfill benchmark: %v: the run prints no figure", err)
		}
	}
	if cut {
		b.Fatalf("backfill benchmark: %d of %d deliveries after 30 minutes: the run prints no figure", done.Load(), total)
	}
	if failed.Load() > 0 {
		b.Fatalf("backfill benchmark: %d deliveries not applied (first: %s): the run prints no figure", failed.Load(), firstFailure)
	}
	if liveFailed.Load() > 0 {
		b.Fatalf("backfill benchmark: the live consumer failed %d deliveries: the run prints no figure", liveFailed.Load())
	}

	// What the consumer applied: every aggregate's versions 1..410, each
	// once; a version applied after a later one of its aggregate is a
	// reorder.
	got := appliedVersions(b, cdb)
	lost, dup, reorders := 0, 0, 0
	for a := range benchAggregates {
		vs := got[fmt.Sprintf("o-%03d", a)]
		seen := map[int64]bool{}
		var top int64
		for _, v := range vs {
			if seen[v] {
				dup++
				continue
			}
			seen[v] = true
			if v < top {
				reorders++
			}
			top = max(top, v)
		}
		lost += benchVersions + benchLive - len(seen)
	}
	var inboxed int
	if err := cdb.QueryRow(ctx, `SELECT count(*) FROM relaybus_inbox`).Scan(&inboxed); err != nil {
		b.Fatal(err)
	}
	fmt.Printf("# backfill: %d history events on %d aggregates (in relaybus_outbox_history) + %d live versions (%d rounds of one version of every aggregate, every %s, from the backfill's start); backfill rate %d/s (history.MaxRate); relay: DefaultConcurrency, pstest in process; consumer: strict handler recording each applied version, %d workers by ordering key, pool %d; Postgres %s\n",
		historyN, benchAggregates, benchAggregates*benchLive, benchLive, benchLiveEvery, history.MaxRate, benchWorkers, benchPool, durable)
	fmt.Printf("# backfill: consumer applied %d versions (inbox %d), lost %d, duplicated %d, reordered %d; broker acknowledged %d backfill messages (packs of up to relay.DefaultMaxPack; %d history events)\n",
		done.Load(), inboxed, lost, dup, reorders, backfilledAcked.Load(), historyN)
	if lost > 0 || dup > 0 || inboxed != total {
		b.Fatalf("backfill benchmark: %d versions lost, %d applied twice, %d in the inbox of %d: the run prints no figure", lost, dup, inboxed, total)
	}
	if reorders > 0 {
		b.Fatalf("backfill benchmark: %d versions applied after a later version of their aggregate: the run prints no figure", reorders)
	}
	published := time.Unix(0, lastBackfillAck.Load())
	fmt.Printf("# backfill stages from the first step: queued %.1f s, last backfill message acknowledged %.1f s, relay idle %.1f s, consumer done %.1f s (%d events/s queued, %d events/s published; rates from a shared 2-core machine under other load)\n",
		queuedAt.Sub(start).Seconds(), published.Sub(start).Seconds(), relayedAt.Sub(start).Seconds(), elapsed.Seconds(),
		int(float64(historyN)/queuedAt.Sub(start).Seconds()), int(float64(historyN)/published.Sub(start).Seconds()))
	stmts := stmts1.Since(stmts0)
	fmt.Printf("# backfill cost over the run, per event delivered (%d): process CPU %.1f µs (backfill steps, relay, in-process pstest and the consume engine together, the live consumer's steady stream included); %.4f publish requests (%d, as pstest received them); %.4f outbox-database statements (%d, pg_stat_statements, the consumer's database left out)\n",
		total, float64((cpu1-cpu0).Microseconds())/float64(total), float64(reqs.calls.Load())/float64(total), reqs.calls.Load(),
		float64(cost.Calls(stmts))/float64(total), cost.Calls(stmts))
	cost.PrintStatements(os.Stdout, "backfill outbox statements", "event", stmts, total, 6)
	var liveInbox int64
	if err := ldb.QueryRow(ctx, `SELECT count(*) FROM relaybus_inbox`).Scan(&liveInbox); err != nil {
		b.Fatal(err)
	}
	wantLive := steadySent.Load() + int64(benchAggregates*benchLive)
	if liveInbox != wantLive {
		b.Fatalf("backfill benchmark: the live consumer's inbox holds %d of %d live events: the run prints no figure", liveInbox, wantLive)
	}
	for p, ds := range lat {
		slices.Sort(ds)
		if len(ds) == 0 {
			b.Fatalf("backfill benchmark: no live delivery measured in phase %d: the run prints no figure", p)
		}
	}
	p99 := func(ds []time.Duration) float64 { return float64(percentile.Sorted(ds, 0.99).Microseconds()) / 1000 }
	without, during := p99(lat[0]), p99(lat[1])
	fmt.Printf("# backfill: live consumer %q (generic projection, %d workers, pool %d): %d events, %d/s steady on %d aggregates of its own plus the live versions; handler p99 %.2f ms over %d deliveries in %s without the backfill, %.2f ms over %d during it (%+.0f %%)\n",
		liveConsumer, liveWorkers, liveWorkers, wantLive, benchSteadyRate, benchSteadyAggregates, without, len(lat[0]), benchQuiet, during, len(lat[1]), (during-without)/without*100)
	benchcheck.Figure(b, "backfill_events_per_s", float64(historyN)/elapsed.Seconds(), "ev/s")
	benchcheck.Figure(b, "backfill_seam_reorders", float64(reorders), "count")
	benchcheck.Figure(b, "consume_p99_ms_without_backfill", without, "ms")
	benchcheck.Figure(b, "consume_p99_ms_during_backfill", during, "ms")
}

// BenchmarkBackfillPublish is the producer's side of BenchmarkBackfill
// alone: the same history queued by the backfill at its highest rate and
// published by a relay to pstest, no consumer. It prints no figure of
// BENCH.md's, only what one event costs there (comment lines): the
// process's CPU (backfill steps, relay and the in-process pstest), the
// publish requests pstest received and the statements the outbox's
// database executed, with the rate as a secondary figure.
func BenchmarkBackfillPublish(b *testing.B) {
	for range b.N {
		backfillPublishBench(b)
	}
}

func backfillPublishBench(b *testing.B) {
	ctx := context.Background()
	durable := pgtest.RequireDurable(b)
	db, url, top := benchHistory(b, benchAggregates, benchVersions)
	const historyN = benchAggregates * benchVersions
	fake, reqs := benchBroker(b)
	sink := benchcheck.NewSink()
	for a := range benchAggregates {
		for v := 1; v <= benchVersions; v++ {
			e := benchEvent(a, int64(v))
			sink.Sent(e.AggregateID, e.ID)
		}
	}
	out := func(msgs []event.Message) {
		for _, m := range msgs {
			for _, im := range unpack(b, m) {
				sink.Got(im.OrderingKey, im.Attributes[event.AttrEventID])
			}
		}
	}
	r, err := relay.New(relay.Options{DB: db, Publisher: tap{next: fake.Client, out: out}, Topology: top, Retention: -1})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close(ctx)
	id := history.NewID(time.Now())
	if _, err := history.Start(ctx, db, id, history.Spec{Topic: topic, Consumer: newbie, Since: time.Now().Add(-24 * time.Hour),
		Until: time.Now(), Rate: history.MaxRate, By: "bench"}); err != nil {
		b.Fatal(err)
	}
	stmts0, err := cost.StatementSnapshot(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	cpu0, err := cost.CPU()
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	var (
		wg     sync.WaitGroup
		runErr error
		end    history.Backfill
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		end, runErr = history.Run(ctx, db, id, time.Now().Add(10*time.Minute))
	}()
	published := 0
	idle := time.NewTicker(5 * time.Millisecond)
	defer idle.Stop()
	for published < historyN && time.Since(start) < 15*time.Minute {
		sum, err := r.Drain(ctx, 10*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		published += sum.Repushed
		if sum.Repushed == 0 {
			<-idle.C // poll for the backfill's next batch
		}
	}
	elapsed := time.Since(start)
	wg.Wait()
	cpu1, _ := cost.CPU()
	stmts1, _ := cost.StatementSnapshot(ctx, url)
	if runErr != nil || end.State != history.StateDone || end.Queued != historyN {
		b.Fatalf("backfill ended %s with %d of %d queued (%v)", end.State, end.Queued, historyN, runErr)
	}
	stmts := stmts1.Since(stmts0)
	defer sink.Require(b, "backfill publish") // the costs above hold whatever order the broker saw
	fmt.Printf("# backfill publish: %d history events on %d aggregates queued by one backfill at %d/s and published by one relay (DefaultConcurrency) to pstest in process, no consumer; Postgres %s\n",
		historyN, benchAggregates, history.MaxRate, durable)
	fmt.Printf("# backfill publish per event: process CPU %.1f µs (backfill steps, relay, pstest); %.4f publish requests (%d, %d messages, as pstest received them); %.4f statements (%d, pg_stat_statements)\n",
		float64((cpu1-cpu0).Microseconds())/historyN, float64(reqs.calls.Load())/historyN, reqs.calls.Load(), reqs.msgs.Load(),
		float64(cost.Calls(stmts))/historyN, cost.Calls(stmts))
	cost.PrintStatements(os.Stdout, "backfill publish statements", "event", stmts, historyN, 6)
	fmt.Printf("# backfill publish: %.0f events/s queued and published (a rate from a shared 2-core machine under other load: secondary)\n", historyN/elapsed.Seconds())
}
