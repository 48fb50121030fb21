package rollup

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/cloudevent"
	ledgerconsumers "github.com/relaybus/relaybus/internal/ledger/consumers"
	"github.com/relaybus/relaybus/internal/ledger/model"
	"github.com/relaybus/relaybus/internal/ledger/query"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relaybus/relaybus/functions/consume"
	"github.com/relaybus/relaybus/internal/batch"
	"github.com/relaybus/relaybus/internal/benchcheck"
	"github.com/relaybus/relaybus/internal/delivery"
	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/fscount"
	"github.com/relaybus/relaybus/internal/ledger"
	"github.com/relaybus/relaybus/internal/percentile"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/internal/pubsubtest"
	"github.com/relaybus/relaybus/internal/registry"
	"github.com/relaybus/relaybus/shared/broker"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/projection"
	"github.com/relaybus/relaybus/shared/topology"
)

// timedRecorder is consume's ledger recorder, noting when each event's
// attempts were written.
type timedRecorder struct {
	*ledger.Recorder
	mu       sync.Mutex
	recorded map[string]time.Time
}

func (r *timedRecorder) RecordAttempts(ctx context.Context, as []model.Attempt) error {
	err := r.Recorder.RecordAttempts(ctx, as)
	if err == nil {
		now := time.Now()
		r.mu.Lock()
		for _, a := range as {
			r.recorded[a.EventID] = now
		}
		r.mu.Unlock()
	}
	return err
}

// ledgerRun is what one BenchmarkLedger round measured.
type ledgerRun struct {
	reads, writes float64   // per event, as the Firestore client's RPCs carried them
	lag, rollup   []float64 // ms: last consumer commit -> status written; last attempt recorded -> status written
	late          int       // events whose rollup did not answer their final status in time
	unwritten     int       // events whose ledger document does not hold the final status
	maxDocWrites  int       // the most writes one document received within a second
	store         *ledger.Store
	ids           []string
}

// ledgerScript varies a ledger run: what the consumers' handlers do, how
// often a failed delivery is redelivered, whether a dead letter is
// replayed, and the status every event ends in.
type ledgerScript struct {
	// handler returns consumer i's handler (projection.Latest when nil).
	handler func(i int) consumer.Handler
	// maxAttempts is the subscriptions' dead-letter threshold (5).
	maxAttempts int
	// replay delivers once more (a dead-letter replay: delivery attempt 1)
	// to a consumer whose deliveries all failed.
	replay bool
	// final is the status every event ends in (CONSUMED).
	final model.Status
}

// runLedger sends events at rate to n consumers, the whole write path real:
// the relay's send recorder (RecordSent in batches, after the "publish"),
// n consume engines (Postgres, inbox, projection, attempts shipped to the
// ledger with their notices on pstest), and the rollup function over HTTP,
// fed by a pull loop on the rollup subscription. Firestore (the emulator)
// is reached through a counter of what the client's RPCs carried.
func runLedger(b testing.TB, n, events, rate int, script ledgerScript) ledgerRun {
	b.Helper()
	if script.maxAttempts == 0 {
		script.maxAttempts = 5
	}
	if script.final == "" {
		script.final = model.StatusConsumed
	}
	ctx := context.Background()
	var counter fscount.Counter
	topic := fmt.Sprintf("bench.n%d.events", n)
	var consumers []registry.Consumer
	for i := range n {
		consumers = append(consumers, registry.Consumer{Topic: topic, ConsumerID: fmt.Sprintf("consumer-%d", i+1), Enabled: true, SortOrder: i})
	}
	store, err := ledger.Open(ctx, ledger.Config{ProjectID: emutest.FirestoreProject(b)}, ledger.Options{}, counter.Options()...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = store.Close() })
	run := ledgerRun{store: store}
	if _, err := ledgerconsumers.New(store.Client(), ledgerconsumers.Options{}).SyncConsumers(ctx, consumers, ledgerconsumers.SyncOptions{}); err != nil {
		b.Fatal(err)
	}
	fake := pubsubtest.New(b)
	top, _ := topology.Load("")
	rollupSub := broker.RollupSubscription(top)
	if _, err := fake.Client.PubSub().TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: "projects/" + pubsubtest.Project + "/topics/" + top.Rollup.Topic}); err != nil {
		b.Fatal(err)
	}
	if _, err := fake.Client.PubSub().SubscriptionAdminClient.CreateSubscription(ctx, &pb.Subscription{
		Name: "projects/" + pubsubtest.Project + "/subscriptions/" + rollupSub, Topic: "projects/" + pubsubtest.Project + "/topics/" + top.Rollup.Topic,
		AckDeadlineSeconds: 60}); err != nil {
		b.Fatal(err)
	}
	h, err := New(ctx, Deps{Ledger: store})
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close(ctx)
	srv := httptest.NewServer(h)
	defer srv.Close()

	pool, _ := pgtest.SchemaConfig(b, func(c *pgxpool.Config) { c.MaxConns = 32 })
	if err := consume.Migrate(ctx, pool); err != nil {
		b.Fatal(err)
	}
	rec := &timedRecorder{Recorder: ledger.NewRecorder(fake.Client, ledger.RecorderOptions{Topic: top.Rollup.Topic}), recorded: map[string]time.Time{}}
	engines := make([]*consumer.Engine, n)
	for i, c := range consumers {
		handler := consumer.Handler(projection.Latest())
		if script.handler != nil {
			handler = script.handler(i)
		}
		e, err := consumer.New(consumer.Options{DB: pool, ConsumerID: c.ConsumerID, Subscription: topic + "." + c.ConsumerID + "-processor",
			Handler: handler, DeadLetters: fake.Client, Ledger: rec, MaxDeliveryAttempts: script.maxAttempts})
		if err != nil {
			b.Fatal(err)
		}
		defer e.Close(ctx)
		engines[i] = e
	}
	// The relay's send recorder: batches of sends, after the publish.
	sends := batch.New(func(ctx context.Context, ss []model.Sent) {
		if err := store.RecordSent(ctx, ss); err != nil {
			b.Error(err)
		}
	}, batch.Options{MaxItems: 200, MaxWait: 5 * time.Millisecond})
	defer sends.Close(ctx)

	// The rollup subscription's push loop: pull, POST, acknowledge on 200.
	var (
		mu       sync.Mutex
		consumed = map[string]time.Time{}
	)
	loopCtx, stopLoop := context.WithCancel(ctx)
	defer stopLoop()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	sub := "projects/" + pubsubtest.Project + "/subscriptions/" + rollupSub
	go func() {
		admin := fake.Client.PubSub().SubscriptionAdminClient
		for loopCtx.Err() == nil {
			resp, err := admin.Pull(loopCtx, &pb.PullRequest{Subscription: sub, MaxMessages: 1000, ReturnImmediately: true})
			if err != nil || len(resp.ReceivedMessages) == 0 {
				time.Sleep(2 * time.Millisecond)
				continue
			}
			for _, rm := range resp.ReceivedMessages {
				go func() {
					m := event.Message{ID: rm.Message.MessageId, Data: rm.Message.Data, Attributes: rm.Message.Attributes}
					r, err := client.Post(srv.URL, "application/json", bytes.NewReader(delivery.WrappedBody(m, sub, 1)))
					if err != nil {
						return
					}
					var a noticeAnswer
					_ = json.NewDecoder(r.Body).Decode(&a)
					r.Body.Close()
					at := time.Now()
					mu.Lock()
					for _, ea := range a.Events {
						if ea.Changed && ea.Status == script.final {
							consumed[ea.EventID] = at
						}
					}
					mu.Unlock()
					if r.StatusCode == http.StatusOK {
						_ = admin.Acknowledge(ctx, &pb.AcknowledgeRequest{Subscription: sub, AckIds: []string{rm.AckId}})
					}
				}()
			}
		}
	}()

	// Warm the send recorder's registry cache (a send of an event nobody
	// consumes here), then count from here.
	warm := &event.Event{Type: "thing.happened", Source: "bench", Topic: topic, AggregateID: "warm-up", Version: 1, Payload: []byte(`{}`)}
	if err := warm.Prepare(time.Now(), event.Limits{}); err != nil {
		b.Fatal(err)
	}
	if err := store.RecordSent(ctx, model.SentAt(time.Now(), warm)); err != nil {
		b.Fatal(err)
	}
	r0, w0 := counter.Reads(), counter.Writes()
	counter.ResetDocs()
	committed := make([]time.Time, events)
	ids := make([]string, events)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range events {
		time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(rate))))
		e := &event.Event{Type: "thing.happened", Source: "bench", Topic: topic, AggregateID: fmt.Sprintf("agg-%d-%d", start.UnixNano(), i),
			Version: 1, Payload: []byte(`{"n":1}`)}
		if err := e.Prepare(time.Now(), event.Limits{}); err != nil {
			b.Fatal(err)
		}
		ids[i] = e.ID
		sends.Add(model.Sent{Event: e, EnqueuedAt: time.Now(), At: time.Now()})
		m, err := cloudevent.Encode(e, event.EncodingJSON)
		if err != nil {
			b.Fatal(err)
		}
		m.ID = "msg-" + e.ID
		for _, eng := range engines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Pub/Sub's deliveries: redelivered while answered non-2xx,
				// up to the dead-letter threshold; then, if the script says
				// so, an operator's replay of the dead letter.
				ok := false
				for attempt := 1; attempt <= script.maxAttempts && !ok; attempt++ {
					d := m
					d.DeliveryAttempt = attempt
					ok = eng.Handle(ctx, delivery.Delivery{Message: d}).Status == http.StatusOK
				}
				if !ok && script.replay {
					d := m
					d.DeliveryAttempt = 1
					ok = eng.Handle(ctx, delivery.Delivery{Message: d}).Status == http.StatusOK
				}
				if !ok && script.final == model.StatusConsumed {
					b.Errorf("delivery of %s failed", m.ID)
				}
				now := time.Now()
				mu.Lock()
				if now.After(committed[i]) {
					committed[i] = now
				}
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		mu.Lock()
		done := len(consumed)
		mu.Unlock()
		if done == events || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	stopLoop()
	run.reads = float64(counter.Reads()-r0) / float64(events)
	run.writes = float64(counter.Writes()-w0) / float64(events)
	run.maxDocWrites, _ = counter.MaxDocWritesPerSecond()
	run.ids = ids
	mu.Lock()
	rec.mu.Lock()
	for i, id := range ids {
		at, ok := consumed[id]
		if !ok {
			run.late++
			continue
		}
		run.lag = append(run.lag, float64(at.Sub(committed[i]).Microseconds())/1000)
		run.rollup = append(run.rollup, float64(at.Sub(rec.recorded[id]).Microseconds())/1000)
	}
	rec.mu.Unlock()
	mu.Unlock()
	// What the ledger holds, read after the counts: every event at its
	// final status, whatever the rollup answered.
	led, err := query.New(store.Client()).Events(ctx, ids)
	if err != nil {
		b.Fatal(err)
	}
	for _, id := range ids {
		if e, ok := led[id]; !ok || e.Status != script.final {
			run.unwritten++
		}
	}
	return run
}

func pctl(xs []float64, p float64) float64 { return percentile.Of(xs, p) }

// BenchmarkLedger measures the ledger's write path end to end with 1, 2,
// 5 and 10 consumers: Firestore reads and writes per event (what the
// client's RPCs carried), the most writes one document received within a
// second, and with 2 consumers at 200 events/s, the lag from the last
// consumer's commit to the final status, and from the last attempt
// recorded to the status written.
func BenchmarkLedger(b *testing.B) {
	for range b.N {
		for _, n := range []int{1, 2, 5, 10} {
			const events, rate = 600, 200
			run := runLedger(b, n, events, rate, ledgerScript{})
			if run.late+run.unwritten > 0 {
				b.Fatalf("ledger n%d: %d of %d events not CONSUMED within 2 minutes, %d not CONSUMED in the ledger: the run prints no figure", n, run.late, events, run.unwritten)
			}
			fmt.Printf("# ledger n%d: %d events at %d/s to %d consumers (consume engines on Postgres, attempts shipped in the background), the relay's send recorder, the rollup function over HTTP (pstest notices, pull loop), Firestore emulator; counted at the Firestore client's RPCs; every event CONSUMED, the percentiles over all %d; commit->final p50 %.1f ms, p99 %.1f ms\n",
				n, events, rate, n, len(run.lag), pctl(run.lag, 0.5), pctl(run.lag, 0.99))
			benchcheck.Figure(b, fmt.Sprintf("ledger_writes_per_event_n%d", n), run.writes, "writes")
			benchcheck.Figure(b, fmt.Sprintf("ledger_reads_per_event_n%d", n), run.reads, "reads")
			if n == 2 {
				benchcheck.Figure(b, "ledger_doc_max_writes_per_s", float64(run.maxDocWrites), "writes")
				benchcheck.Figure(b, "ledger_lag_p99_ms", pctl(run.lag, 0.99), "ms")
				benchcheck.Figure(b, "rollup_p99_ms", pctl(run.rollup, 0.99), "ms")
			}
		}
	}
}
