package devstack

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/relaybus/relaybus/internal/benchcheck"
	"github.com/relaybus/relaybus/internal/delivery"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/topology"
)

// BenchmarkLoopThroughput measures how fast the delivery loop drains one
// subscription into a trivial endpoint (200 at once, in the same process):
// 20,000 queued messages on 2,000 ordering keys, ordered push (one in
// flight per key) and Eventarc shapes, against in-process pstest and the
// gcloud emulator. The loop's defaults (64 in flight, 1,000 held).
func BenchmarkLoopThroughput(b *testing.B) {
	const n, keys = 20000, 2000
	for _, backend := range backends {
		for _, mode := range []string{topology.DeliveryPush, topology.DeliveryEventarc} {
			b.Run(backend+"/"+mode, func(b *testing.B) {
				for range b.N {
					f := newLoopFixture(b, backend)
					got, took := loopDrain(f, mode, n, keys)
					name := "loop_push_msgs_per_s"
					if mode == topology.DeliveryEventarc {
						name = "loop_eventarc_msgs_per_s"
					}
					if backend == "emulator" {
						name += "_emulator"
					}
					fmt.Printf("# loop throughput: %d queued messages on %d keys, %s shape, %s, trivial 200 endpoint, loop defaults; %d delivered in %v\n",
						n, keys, mode, backend, got, took.Round(time.Millisecond))
					if got < n {
						b.Fatalf("%d of %d messages delivered in %v", got, n, took)
					}
					benchcheck.Figure(b, name, float64(got)/took.Seconds(), "msg/s")
				}
			})
		}
	}
}

// loopDrain queues n messages on keys ordering keys, runs the loop with its
// defaults over one subscription of the given delivery shape into a
// trivial endpoint (200 at once, in the same process), and returns how
// many arrived and how long they took (at most 5 minutes).
//
// It fails f's test unless every message arrived once, and for the push
// shape in its key's order.
func loopDrain(f *loopFixture, mode string, n, keys int) (int64, time.Duration) {
	var got atomic.Int64
	sink := benchcheck.NewDetailedSink()
	if mode == topology.DeliveryEventarc {
		sink = benchcheck.NewUnorderedSink()
	}
	for k := range keys {
		for i := k; i < n; i += keys {
			sink.Sent("k"+strconv.Itoa(k), strconv.Itoa(i))
		}
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if d, err := delivery.Read(r, 1<<20); err == nil {
			sink.Got(d.Message.Attributes["key"], d.Message.Attributes["n"])
		}
		got.Add(1)
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	sub := "test.loop.events.bench-processor"
	f.mkSub(&pb.Subscription{Name: sub, Topic: f.topic, EnableMessageOrdering: true})
	f.publishMany(n, keys)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t0 := time.Now()
	go func() {
		f.loop().Run(ctx, []Route{{Subscription: sub, Topic: f.topic, URL: srv.URL, Mode: mode}})
		close(done)
	}()
	for got.Load() < int64(n) && time.Since(t0) < 5*time.Minute {
		time.Sleep(time.Millisecond)
	}
	took := time.Since(t0)
	cancel()
	<-done
	if got.Load() >= int64(n) {
		sink.Require(f.t, "loop throughput, "+mode)
	}
	return got.Load(), took
}

// BenchmarkLoopLatency measures what the loop adds to end-to-end latency:
// messages published open loop at 200/s and 2,000/s for 5 s (each on its
// own ordering key, as the demo's orders are), from each publish's
// scheduled time to the trivial endpoint receiving it, ordered push shape,
// in-process pstest.
func BenchmarkLoopLatency(b *testing.B) {
	for _, rate := range []int{200, 2000} {
		b.Run(fmt.Sprint(rate), func(b *testing.B) {
			for range b.N {
				f := newLoopFixture(b, "pstest")
				const seconds = 5
				n := rate * seconds
				arrived := make([]atomic.Int64, n)
				var dups atomic.Int64
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					d, err := delivery.Read(r, 0)
					if err == nil {
						if i, err := strconv.Atoi(d.Message.Attributes["n"]); err == nil && i < n {
							if !arrived[i].CompareAndSwap(0, time.Now().UnixNano()) {
								dups.Add(1)
							}
						}
					}
					w.WriteHeader(http.StatusOK)
				}))
				sub := "test.loop.events.bench-processor"
				f.mkSub(&pb.Subscription{Name: sub, Topic: f.topic, EnableMessageOrdering: true})
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan struct{})
				go func() {
					f.loop().Run(ctx, []Route{{Subscription: sub, Topic: f.topic, URL: srv.URL, Mode: topology.DeliveryPush}})
					close(done)
				}()
				time.Sleep(200 * time.Millisecond)
				sched := make([]time.Time, n)
				var failed atomic.Int64
				begin := time.Now()
				for i := range n {
					sched[i] = begin.Add(time.Duration(i) * time.Second / time.Duration(rate))
					time.Sleep(time.Until(sched[i]))
					res := f.client.PublishAsync(ctx, f.topic, event.Message{Data: []byte(`{}`), OrderingKey: "k" + strconv.Itoa(i),
						Attributes: map[string]string{"n": strconv.Itoa(i)}})
					go func() {
						if _, err := res.Get(ctx); err != nil {
							failed.Add(1)
						}
					}()
				}
				arrivedAll := func() bool {
					for i := range arrived {
						if arrived[i].Load() == 0 {
							return false
						}
					}
					return true
				}
				for deadline := time.Now().Add(time.Minute); !arrivedAll() && time.Now().Before(deadline); {
					time.Sleep(10 * time.Millisecond)
				}
				cancel()
				<-done
				srv.Close()
				var lat []time.Duration
				missing := 0
				for i := range arrived {
					if at := arrived[i].Load(); at != 0 {
						lat = append(lat, time.Unix(0, at).Sub(sched[i]))
					} else {
						missing++
					}
				}
				if missing > 0 || failed.Load() > 0 || dups.Load() > 0 {
					b.Fatalf("loop latency: %d of %d messages did not arrive within a minute, %d publishes failed, %d arrived twice: the run prints no figure",
						missing, n, failed.Load(), dups.Load())
				}
				p := percentiles(lat)
				fmt.Printf("# loop latency: %d messages published open loop at %d/s on distinct keys, ordered push shape, pstest, trivial endpoint; scheduled publish → endpoint; all %d delivered once\n",
					n, rate, len(lat))
				benchcheck.Figure(b, fmt.Sprintf("loop_delivery_p50_ms_at_%d", rate), p.P50, "ms")
				benchcheck.Figure(b, fmt.Sprintf("loop_delivery_p99_ms_at_%d", rate), p.P99, "ms")
			}
		})
	}
}

// BenchmarkLoopStreamingPullBaseline runs what the loop replaced beside
// the loop, in the same process, over the same work: 2,000 queued messages
// on 2,000 keys, ordered push shape, pstest, a trivial endpoint. The
// baseline is StreamingPull (Subscriber.Receive, one stream, 256
// outstanding, as the old loop) POSTing each message and acking it;
// pstest's deliver tick hands a stream about one message per 10 ms. It
// prints both rates and their ratio.
func BenchmarkLoopStreamingPullBaseline(b *testing.B) {
	const n = 2000
	for range b.N {
		loopGot, loopTook := loopDrain(newLoopFixture(b, "pstest"), topology.DeliveryPush, n, n)
		if loopGot < n {
			b.Fatalf("the loop delivered %d of %d messages in %v", loopGot, n, loopTook)
		}
		loopRate := float64(loopGot) / loopTook.Seconds()
		f := newLoopFixture(b, "pstest")
		var got atomic.Int64
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			got.Add(1)
			w.WriteHeader(http.StatusOK)
		}))
		sub := "test.loop.events.bench-processor"
		f.mkSub(&pb.Subscription{Name: sub, Topic: f.topic, EnableMessageOrdering: true})
		f.publishMany(n, n)
		ctx, cancel := context.WithCancel(context.Background())
		s := f.client.PubSub().Subscriber(sub)
		s.ReceiveSettings.NumGoroutines = 1
		s.ReceiveSettings.MaxOutstandingMessages = 256
		done := make(chan struct{})
		t0 := time.Now()
		go func() {
			defer close(done)
			_ = s.Receive(ctx, func(_ context.Context, m *pubsub.Message) {
				body := delivery.WrappedBody(event.Message{ID: m.ID, Data: m.Data, Attributes: m.Attributes, OrderingKey: m.OrderingKey,
					PublishTime: m.PublishTime}, sub, 1)
				resp, err := http.Post(srv.URL, "application/json", bytes.NewReader(body))
				if err == nil {
					resp.Body.Close()
				}
				m.Ack()
			})
		}()
		for got.Load() < n && time.Since(t0) < 5*time.Minute {
			time.Sleep(time.Millisecond)
		}
		took := time.Since(t0)
		cancel()
		<-done
		srv.Close()
		if got.Load() < n {
			b.Fatalf("StreamingPull delivered %d of %d messages in %v", got.Load(), n, took)
		}
		baseRate := float64(got.Load()) / took.Seconds()
		fmt.Printf("# loop baseline: %d queued messages on %d keys, ordered push shape, pstest, trivial 200 endpoint; the loop (defaults) %d in %v, %.0f msg/s; StreamingPull (Receive, 1 stream, 256 outstanding) as the old loop %d in %v; loop / StreamingPull = %.1fx\n",
			n, n, loopGot, loopTook.Round(time.Millisecond), loopRate, got.Load(), took.Round(time.Millisecond), loopRate/baseRate)
		benchcheck.Figure(b, "loop_streamingpull_baseline_msgs_per_s", baseRate, "msg/s")
	}
}
