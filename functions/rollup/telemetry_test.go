package rollup

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/relaybus/relaybus/shared/ledger/model"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/relaybus/relaybus/shared/telemetry"
)

// hops returns the relaybus.hop.duration points of hop: their count and
// sum, in seconds.
func hops(t *testing.T, r *sdkmetric.ManualReader, hop string) (count uint64, sum float64) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			h, ok := m.Data.(metricdata.Histogram[float64])
			if m.Name != telemetry.MetricHopDuration || !ok {
				continue
			}
			for _, p := range h.DataPoints {
				if v, _ := p.Attributes.Value(telemetry.KeyHop); v.AsString() == hop {
					if d, _ := p.Attributes.Value(telemetry.KeyDestination); d.AsString() != topic {
						t.Errorf("hop %s recorded for topic %q, want %s", hop, d.AsString(), topic)
					}
					count, sum = count+p.Count, sum+p.Sum
				}
			}
		}
	}
	return count, sum
}

// When the rollup writes an event's final status it records the hop
// "consumer commit → final status" from the newest consumer commit, once
// (a redelivered notice that changes nothing records nothing), and its
// fold and the ledger's write are spans, the write under the fold.
func TestFinalStatusRecordsTheCommitToStatusHop(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans), sdktrace.WithSampler(telemetry.Sampler(1)))
	restore := telemetry.Install(tp, sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	defer restore()

	ctx := context.Background()
	env := start(t)
	e := newEvent(t)
	if err := env.store.RecordSent(ctx, model.SentAt(time.Now(), e)); err != nil {
		t.Fatal(err)
	}
	first, last := time.Now().Add(-5*time.Second).UTC(), time.Now().Add(-2*time.Second).UTC()
	member := model.Attempt{EventID: e.ID, ConsumerID: "member-service", AttemptNo: 1, Success: true, Outcome: model.OutcomeSuccess,
		ConsumedAt: first, MessageID: "m-1", Topic: topic}
	message := member
	message.ConsumerID, message.ConsumedAt = "message-service", last

	// member-service alone: PENDING stays open, no hop.
	m := model.FoldMessage([]model.Attempt{member})
	m.ID, m.PublishTime = "fold-1-"+e.ID, time.Now()
	if a := do(t, requests(t, env.url, m)["push"]); a.code != http.StatusOK || a.body.Status.Settled() {
		t.Fatalf("one consumer of two: %d %+v, want 200 and an open status", a.code, a.body)
	}
	if n, _ := hops(t, reader, telemetry.HopCommitToStatus); n != 0 {
		t.Fatalf("%d commit_to_status points before the final status, want 0", n)
	}

	m = model.FoldMessage([]model.Attempt{message})
	m.ID, m.PublishTime = "fold-2-"+e.ID, time.Now()
	before := time.Now()
	if a := do(t, requests(t, env.url, m)["push"]); a.code != http.StatusOK || a.body.Status != model.StatusConsumed || !a.body.Changed {
		t.Fatalf("the second consumer: %d %+v, want 200 CONSUMED", a.code, a.body)
	}
	done := time.Now()
	n, sum := hops(t, reader, telemetry.HopCommitToStatus)
	if lo, hi := before.Sub(last), done.Sub(last); n != 1 || sum < lo.Seconds() || sum > hi.Seconds() {
		t.Fatalf("commit_to_status: %d points summing %.3fs, want 1 of %.3fs to %.3fs (from message-service's commit, the newest)", n, sum, lo.Seconds(), hi.Seconds())
	}
	// Redelivered: the status is already CONSUMED, nothing is recorded.
	if a := do(t, requests(t, env.url, m)["push"]); a.code != http.StatusOK || a.body.Changed {
		t.Fatalf("redelivered: %d %+v", a.code, a.body)
	}
	if n, _ := hops(t, reader, telemetry.HopCommitToStatus); n != 1 {
		t.Fatalf("%d commit_to_status points after a redelivery, want still 1", n)
	}

	folds := map[[8]byte]bool{}
	var writes []sdktrace.ReadOnlySpan
	for _, s := range spans.GetSpans().Snapshots() {
		switch s.Name() {
		case "rollup fold":
			folds[s.SpanContext().SpanID()] = true
			if !hasAttr(s.Attributes(), telemetry.KeyBatchCount) {
				t.Errorf("the fold span has no %s", telemetry.KeyBatchCount)
			}
		case "ledger write":
			writes = append(writes, s)
		}
	}
	if len(folds) < 3 || len(writes) < 2 {
		t.Fatalf("%d fold and %d ledger write spans, want a fold per notice and a write per fold that wrote", len(folds), len(writes))
	}
	for _, w := range writes {
		if !folds[w.Parent().SpanID()] {
			t.Errorf("a ledger write span's parent %s is no fold span", w.Parent().SpanID())
		}
	}
}

func hasAttr(kvs []attribute.KeyValue, k attribute.Key) bool {
	for _, kv := range kvs {
		if kv.Key == k {
			return true
		}
	}
	return false
}
