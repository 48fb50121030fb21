package devstack

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

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
					var got atomic.Int64
					srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
						got.Add(1)
						w.WriteHeader(http.StatusOK)
					}))
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
					for got.Load() < n && time.Since(t0) < 5*time.Minute {
						time.Sleep(time.Millisecond)
					}
					took := time.Since(t0)
					cancel()
					<-done
					srv.Close()
					name := "loop_push_msgs_per_s"
					if mode == topology.DeliveryEventarc {
						name = "loop_eventarc_msgs_per_s"
					}
					if backend == "emulator" {
						name += "_emulator"
					}
					fmt.Printf("# loop throughput: %d queued messages on %d keys, %s shape, %s, trivial 200 endpoint, loop defaults; %d delivered in %v\n",
						n, keys, mode, backend, got.Load(), took.Round(time.Millisecond))
					fmt.Printf("BENCH %s %.0f msg/s\n", name, float64(got.Load())/took.Seconds())
				}
			})
		}
	}
}
