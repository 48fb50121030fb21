package devstack

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/relaybus/relaybus/internal/benchcheck"
	"github.com/relaybus/relaybus/internal/delivery"
	"github.com/relaybus/relaybus/internal/pull"
)

// BenchmarkPullThroughput is BenchmarkLoopThroughput's pull shape: the
// same 20,000 queued messages on 2,000 ordering keys of an ordered
// subscription in in-process pstest, drained by the pull consumer mode's
// worker (internal/pull: unary Pull with lease renewal, one in flight per
// key, its defaults: 16 in flight, 256 held) into a trivial engine that
// accepts at once, in the same process: pull mode hands messages to the
// engine in process, with no HTTP hop.
func BenchmarkPullThroughput(b *testing.B) {
	const n, keys = 20000, 2000
	for range b.N {
		f := newLoopFixture(b, "pstest")
		sub := "test.loop.events.bench-processor"
		f.mkSub(&pb.Subscription{Name: sub, Topic: f.topic, EnableMessageOrdering: true})
		f.publishMany(n, keys)
		var got atomic.Int64
		sink := benchcheck.NewDetailedSink()
		for k := range keys {
			for i := k; i < n; i += keys {
				sink.Sent("k"+strconv.Itoa(k), strconv.Itoa(i))
			}
		}
		w, err := pull.New(pull.Options{Source: f.client, Subscription: sub, DeadLetters: f.client, Project: f.project,
			Engine: acceptAll{&got, sink}})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		t0 := time.Now()
		go func() { _ = w.Run(ctx); close(done) }()
		for got.Load() < n && time.Since(t0) < 5*time.Minute {
			time.Sleep(time.Millisecond)
		}
		took := time.Since(t0)
		cancel()
		<-done
		fmt.Printf("# pull throughput: %d queued messages on %d keys, ordered subscription, pstest, internal/pull's worker (defaults: %d in flight, %d held), trivial in-process engine; %d delivered in %v\n",
			n, keys, pull.DefaultMaxInFlight, pull.DefaultMaxOutstanding, got.Load(), took.Round(time.Millisecond))
		if got.Load() < n {
			b.Fatalf("%d of %d messages delivered in %v", got.Load(), n, took)
		}
		sink.Require(b, "pull throughput")
		benchcheck.Figure(b, "loop_pull_msgs_per_s", float64(got.Load())/took.Seconds(), "msg/s")
	}
}

// acceptAll is a trivial engine: every delivery accepted at once.
type acceptAll struct {
	n    *atomic.Int64
	sink *benchcheck.Sink
}

func (a acceptAll) Handle(_ context.Context, d delivery.Delivery) pull.Answer {
	a.sink.Got(d.Message.Attributes["key"], d.Message.Attributes["n"])
	a.n.Add(1)
	return pull.Answer{Status: http.StatusOK}
}
