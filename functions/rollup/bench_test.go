package rollup

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/firestore"
	"cloud.google.com/go/pubsub/v2"

	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/pubsubtest"
	"github.com/relaybus/relaybus/shared/delivery"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/ledger"
	"github.com/relaybus/relaybus/shared/registry"
	"github.com/relaybus/relaybus/shared/topology"
	"github.com/relaybus/relaybus/shared/transport"
)

// BenchmarkRollupLatency measures, per event, the time from its last
// attempt being recorded to its CONSUMED status being written: the notice
// goes through Pub/Sub (pstest) and a push delivery loop to the rollup
// function over HTTP, which rolls up on the Firestore emulator.
func BenchmarkRollupLatency(b *testing.B) {
	const (
		events = 200
		rate   = 50 // events per second
	)
	for i := 0; i < b.N; i++ {
		ctx := context.Background()
		top, err := topology.Load("../../infra/topology.yaml")
		if err != nil {
			b.Fatal(err)
		}
		c, err := firestore.NewClientWithDatabase(ctx, emutest.FirestoreProject(b), ledger.DefaultDatabase)
		if err != nil {
			b.Fatal(err)
		}
		store := ledger.New(c, ledger.Options{})
		if _, err := store.SyncConsumers(ctx, registry.Consumers(top), ledger.SyncOptions{}); err != nil {
			b.Fatal(err)
		}
		ps := pubsubtest.New(b)
		ps.Provision(b, top)
		h, _ := New(ctx, Deps{Ledger: store})
		srv := httptest.NewServer(h)
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

		var (
			mu      sync.Mutex
			written = map[string]time.Time{}
			posts   []float64 // request to response of each notice, ms
		)
		// The push delivery loop: one POST per notice, redelivered on non-2xx.
		loopCtx, stop := context.WithCancel(ctx)
		loopDone := make(chan struct{})
		go func() {
			defer close(loopDone)
			_ = ps.Client.PubSub().Subscriber(transport.RollupSubscription(top)).Receive(loopCtx, func(_ context.Context, m *pubsub.Message) {
				msg := event.Message{ID: m.ID, Data: m.Data, Attributes: m.Attributes, PublishTime: m.PublishTime}
				posted := time.Now()
				defer func() {
					mu.Lock()
					posts = append(posts, float64(time.Since(posted))/float64(time.Millisecond))
					mu.Unlock()
				}()
				resp, err := client.Post(srv.URL, "application/json", bytes.NewReader(delivery.WrappedBody(msg, "rollup", 1)))
				if err != nil {
					m.Nack()
					return
				}
				var a noticeAnswer
				_ = json.NewDecoder(resp.Body).Decode(&a)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					m.Nack()
					return
				}
				if a.Changed && a.Status == ledger.StatusConsumed {
					mu.Lock()
					written[a.EventID] = time.Now()
					mu.Unlock()
				}
				m.Ack()
			})
		}()

		batch := make([]*event.Event, events)
		for j := range batch {
			e := &event.Event{Type: "order.purchased", Topic: "shop.order.events", AggregateID: fmt.Sprintf("ORD-%d", j), Version: 1,
				Payload: []byte(`{"orderId":"x"}`), Initiator: event.Initiator{Service: "order-service"}}
			if err := e.Prepare(time.Now(), event.Limits{}); err != nil {
				b.Fatal(err)
			}
			batch[j] = e
		}
		if err := store.RecordSent(ctx, ledger.SentAt(time.Now(), batch...)); err != nil {
			b.Fatal(err)
		}
		recorded := make([]time.Time, events)
		var wg sync.WaitGroup
		tick := time.NewTicker(time.Second / rate)
		for j, e := range batch {
			<-tick.C
			wg.Add(1)
			go func(j int, e *event.Event) {
				defer wg.Done()
				for _, cons := range []string{"member-service", "message-service"} {
					a := ledger.Attempt{EventID: e.ID, ConsumerID: cons, AttemptNo: 1, Success: true, Outcome: ledger.OutcomeSuccess}
					if _, err := store.InsertAttempt(ctx, a); err != nil {
						b.Error(err)
						return
					}
					recorded[j] = time.Now() // the last attempt is the second
					if _, err := ps.Client.Publish(ctx, top.Rollup.Topic, ledger.RollupMessage(e.ID)); err != nil {
						b.Error(err)
						return
					}
				}
			}(j, e)
		}
		tick.Stop()
		wg.Wait()
		deadline := time.Now().Add(30 * time.Second)
		for {
			mu.Lock()
			n := len(written)
			mu.Unlock()
			if n == events || time.Now().After(deadline) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		stop()
		<-loopDone
		srv.Close()
		_ = c.Close()

		var lat []float64
		for j, e := range batch {
			if w, ok := written[e.ID]; ok {
				lat = append(lat, float64(max(w.Sub(recorded[j]), 0))/float64(time.Millisecond))
			}
		}
		if len(lat) != events {
			b.Fatalf("%d of %d events reached CONSUMED", len(lat), events)
		}
		pct := func(xs []float64, p float64) float64 {
			sort.Float64s(xs)
			return xs[min(len(xs)-1, int(p*float64(len(xs))))]
		}
		fmt.Printf("BENCH rollup_p99_ms %.1f ms\n", pct(lat, 0.99))
		fmt.Printf("rollup latency: %d events at %d ev/s, 2 consumers each; last attempt recorded -> CONSUMED written, through pstest, a push loop, HTTP and the Firestore emulator: p50 %.1f ms, p99 %.1f ms; of which the rollup request itself (%d notices): p50 %.1f ms, p99 %.1f ms\n",
			events, rate, pct(lat, 0.50), pct(lat, 0.99), len(posts), pct(posts, 0.50), pct(posts, 0.99))
	}
}
