package rollup

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"cloud.google.com/go/firestore"

	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/ledger"
	"github.com/relaybus/relaybus/internal/ledger/consumers"
	"github.com/relaybus/relaybus/internal/ledger/model"
	"github.com/relaybus/relaybus/internal/ledger/query"
	"github.com/relaybus/relaybus/internal/registry"
	"github.com/relaybus/relaybus/shared/event"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/relaybus/relaybus/internal/telemetry"
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

// The reconciler and the expiry sweep record commit_to_status too when
// they write a settled status: the rollup's notices were lost (none is
// sent here), so the reconciler settles one event CONSUMED and one whose
// expiry passed EXPIRED, each from its newest consumer commit to the
// store's clock; the sweep expires a third. A second run changes nothing
// and records nothing.
func TestReconcilerAndExpirySettlementsRecordTheCommitToStatusHop(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	restore := telemetry.Install(sdktrace.NewTracerProvider(), sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	defer restore()

	ctx := context.Background()
	project := emutest.FirestoreProject(t)
	c, err := firestore.NewClientWithDatabase(ctx, project, ledger.DefaultDatabase)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now().UTC().Truncate(time.Millisecond)
	now := start
	store := ledger.New(c, ledger.Options{Now: func() time.Time { return now }})
	if _, err := consumers.New(store.Client(), consumers.Options{}).SyncConsumers(ctx, []registry.Consumer{
		{Topic: topic, ConsumerID: "member-service", Enabled: true, SortOrder: 1},
		{Topic: topic, ConsumerID: "message-service", Enabled: true, SortOrder: 2},
	}, consumers.SyncOptions{}); err != nil {
		t.Fatal(err)
	}
	h, err := New(ctx, Deps{Ledger: store})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	attempt := func(e *event.Event, consumer string, at time.Time) model.Attempt {
		return model.Attempt{EventID: e.ID, ConsumerID: consumer, AttemptNo: 1, Success: true, Outcome: model.OutcomeSuccess,
			ConsumedAt: at, MessageID: "m-" + consumer, Topic: topic}
	}
	post := func(path string) {
		t.Helper()
		resp, err := http.Post(srv.URL+path, "application/json", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d", path, resp.StatusCode)
		}
	}

	// consumed: both consumers succeeded, at +10 s and +20 s. expiring:
	// member-service succeeded at +5 s, message-service never reports, and
	// it expires at +30 s.
	consumed, expiring := newEvent(t), newEvent(t)
	expiring.ExpireAt = start.Add(30 * time.Second)
	if err := store.RecordSent(ctx, model.SentAt(start, consumed, expiring)); err != nil {
		t.Fatal(err)
	}
	if err := store.InsertAttempts(ctx, []model.Attempt{attempt(consumed, "member-service", start.Add(10*time.Second)),
		attempt(consumed, "message-service", start.Add(20*time.Second)), attempt(expiring, "member-service", start.Add(5*time.Second))}); err != nil {
		t.Fatal(err)
	}
	now = start.Add(ledger.DefaultReconcileAfter + time.Second) // +61 s: both are due
	post("/reconcile")
	for id, want := range map[string]model.Status{consumed.ID: model.StatusConsumed, expiring.ID: model.StatusExpired} {
		if d, err := query.New(store.Client()).Get(ctx, id); err != nil || d.Event.Status != want {
			t.Fatalf("after /reconcile: %s is %s (%v), want %s", id, d.Event.Status, err, want)
		}
	}
	// 61-20 and 61-5 seconds.
	if n, sum := hops(t, reader, telemetry.HopCommitToStatus); n != 2 || sum != 41+56 {
		t.Fatalf("commit_to_status after /reconcile: %d points summing %.3fs, want 2 summing 97s", n, sum)
	}

	// The sweep: sent at +61 s, member-service at +63 s, expired at +65 s;
	// the sweep runs at +70 s, before the reconciler's turn (+121 s).
	swept := newEvent(t)
	swept.ExpireAt = now.Add(4 * time.Second)
	if err := store.RecordSent(ctx, model.SentAt(now, swept)); err != nil {
		t.Fatal(err)
	}
	if err := store.InsertAttempts(ctx, []model.Attempt{attempt(swept, "member-service", now.Add(2*time.Second))}); err != nil {
		t.Fatal(err)
	}
	now = now.Add(9 * time.Second)
	post("/expire")
	if d, err := query.New(store.Client()).Get(ctx, swept.ID); err != nil || d.Event.Status != model.StatusExpired {
		t.Fatalf("after /expire: %s (%v), want EXPIRED", d.Event.Status, err)
	}
	if n, sum := hops(t, reader, telemetry.HopCommitToStatus); n != 3 || sum != 97+7 {
		t.Fatalf("commit_to_status after /expire: %d points summing %.3fs, want 3 summing 104s", n, sum)
	}
	post("/reconcile")
	post("/expire")
	if n, _ := hops(t, reader, telemetry.HopCommitToStatus); n != 3 {
		t.Fatalf("%d commit_to_status points after runs that changed nothing, want still 3", n)
	}
}
