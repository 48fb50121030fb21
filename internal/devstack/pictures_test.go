package devstack

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image/png"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/relaybus/relaybus/internal/cloudevent"
	"github.com/relaybus/relaybus/internal/dashview"
	"github.com/relaybus/relaybus/internal/eventually"
	"github.com/relaybus/relaybus/internal/otelsetup"
	"github.com/relaybus/relaybus/internal/screenshot"
	"github.com/relaybus/relaybus/internal/telemetry"
	"github.com/relaybus/relaybus/internal/waterfall"
	"github.com/relaybus/relaybus/shared/broker/pubsub"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/relay"
)

// EnvScreenshots names the directory the pictures go to (docs/telemetry
// for docs/telemetry.md: make screenshots); without it, the test's temporary
// directory.
const EnvScreenshots = "RELAYBUS_SCREENSHOTS"

// docs/telemetry.md's pictures of the telemetry, from a scripted run on the local
// stack with telemetry recording into memory: the waterfall of one
// purchase's trace as the in-memory exporter received it, and the relaybus
// dashboard as Terraform deploys it (infra/terraform/telemetry.tf), each
// tile's PromQL evaluated over the metrics a manual reader collected every
// second of the run, both shot by a headless Chromium. The test fails when
// the trace lacks a hop, a tile's query does not parse, or a tile has no
// data the run should have given it.
func TestTelemetryPictures(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a browser; go test -short skips it")
	}
	ctx := context.Background()
	spans := tracetest.NewInMemoryExporter()
	tp := otelsetup.NewTracerProvider(1, nil, sdktrace.WithSyncer(spans))
	reader := sdkmetric.NewManualReader()
	restore := telemetry.Install(tp, sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	defer restore()

	dash, err := dashview.FromTerraform(filepath.Join("..", "..", "infra", "terraform", "telemetry.tf"), "relaybus")
	if err != nil {
		t.Fatal(err)
	}
	s := startOnTestSchema(t, 500*time.Millisecond)
	defer closeStack(s)
	for name, pool := range s.Pools { // as make dev does
		defer telemetry.ObserveOutbox(name, func(ctx context.Context) (telemetry.OutboxBacklog, error) { return relay.Backlog(ctx, pool) })() //nolint:errcheck
	}

	// The reader collects every second of the run, from its start.
	rec := &dashview.Recording{}
	var mu sync.Mutex
	var last metricdata.ResourceMetrics
	collect := func() {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(ctx, &rm); err != nil {
			t.Error(err)
			return
		}
		mu.Lock()
		rec.Add(time.Now(), rm)
		last = rm
		mu.Unlock()
	}
	collect()
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				collect()
			}
		}
	}()

	run := event.NewID()[:8]
	publish := func(topic, eventType, aggType, aggID string, version int, payload map[string]any) string {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"eventType": eventType, "topic": topic, "aggregateType": aggType,
			"aggregateId": aggID, "version": version, "source": "order-service", "payload": payload})
		resp, err := http.Post(s.Info.URL+"/publish", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var res struct{ TraceID string }
		_ = json.NewDecoder(resp.Body).Decode(&res)
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("publish %s %s v%d: %d", topic, aggID, version, resp.StatusCode)
		}
		return res.TraceID
	}
	purchase := func(n int, failFirst bool) string {
		order := fmt.Sprintf("order-%s-%d", run, n)
		return publish("shop.order.events", "order.purchased", "order", order, 1,
			map[string]any{"orderId": order, "memberId": fmt.Sprintf("member-%s-%d", run, n%5), "amount": 10 + n, "failFirstNotify": failFirst})
	}

	// The pictured purchase: every delivery succeeds at once (a
	// redelivery would come back after the subscription's backoff, 10 s,
	// and squash the rest of the waterfall into its first pixels; the
	// tree in docs/telemetry.md, "The trace", shows one).
	traced := purchase(0, false)
	// Traffic for the dashboard: 24 purchases over 12 s (one in six
	// redelivered once), five members' points piling up.
	purchases := 25
	for n := 1; n < purchases; n++ {
		time.Sleep(500 * time.Millisecond)
		purchase(n, n%6 == 0)
	}
	// A poison message: dead-lettered by both consumers, a missing id.
	ps, err := pubsub.Dial(ctx, s.Info.Project, s.Info.PubSubHost, pubsub.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ps.Close()
	if _, err := ps.Publish(ctx, "shop.order.events", event.Message{Data: []byte(`{"note":"no aggregate id"}`),
		Attributes: map[string]string{"event_id": "poison-" + run, "event_type": "order.purchased"}}); err != nil {
		t.Fatal(err)
	}
	// The version lag: audit-service's projection of member.points.events
	// gets versions 1, 2 and 5 of one member (3 and 4 never come: lag 2),
	// then a late version 3 straight onto the topic (stale).
	lagged := "member-lag-" + run
	for _, v := range []int{1, 2, 5} {
		publish("member.points.events", "points.added", "member", lagged, v, map[string]any{"memberId": lagged, "points": v})
	}
	late := &event.Event{Type: "points.added", Topic: "member.points.events", AggregateType: "member", AggregateID: lagged, Version: 3,
		Payload: []byte(`{"points":3}`), PayloadType: "application/json", Initiator: event.Initiator{Service: "member-service"}}
	if err := late.Prepare(time.Now(), event.Limits{}); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, 90*time.Second, "version 5 applied", func() bool {
		return lagCount(snapshot(&mu, &last)) >= 1
	})
	msg, err := cloudevent.Encode(late, event.EncodingJSON)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ps.Publish(ctx, "member.points.events", msg); err != nil {
		t.Fatal(err)
	}

	// Done when audit-service applied every purchase's two children and
	// the stale version was counted; then ten seconds more of quiet.
	eventually.True(t, 120*time.Second, "the run's last deliveries", func() bool {
		rm := snapshot(&mu, &last)
		c := sums(rm, telemetry.MetricConsumedMessages, telemetry.KeyConsumer, telemetry.KeyOutcome)
		st := sums(rm, telemetry.MetricProjectionStale, telemetry.KeyConsumer)
		return c["audit-service/success"] >= int64(2*purchases+3) && st["audit-service"] == 1
	})
	// Not a synchronization: the dashboard's time axis goes on past the
	// last delivery, as the rates fall back.
	time.Sleep(10 * time.Second)
	close(stop)
	<-stopped
	collect()

	dir := os.Getenv(EnvScreenshots)
	if dir == "" {
		dir = t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}

	// The trace.
	id, err := trace.TraceIDFromHex(traced)
	if err != nil {
		t.Fatalf("publish answered trace id %q: %v", traced, err)
	}
	all := spans.GetSpans()
	rows := waterfall.Rows(id, all, waterfall.Options{})
	var seen []string
	linked := 0
	for _, r := range rows {
		if r.Kind == "consumer" {
			seen = append(seen, r.Detail)
		}
		if r.Linked {
			linked++
		}
	}
	want := []string{"member-service · success", "message-service · success", "audit-service · success", "audit-service · success"}
	for _, w := range want {
		if !contains(seen, w) {
			t.Errorf("the waterfall has no delivery %q: %v", w, seen)
		}
	}
	if len(seen) != len(want) || linked != 2 || rows[0].Name != "publish" {
		t.Errorf("the waterfall: %d deliveries %v, %d linked publishes (want 2), first %q (want publish)", len(seen), seen, linked, rows[0].Name)
	}
	page, err := waterfall.HTML(id, all, waterfall.Options{Title: "One purchase on the local stack: order.purchased, its two consumers, their child events"})
	if err != nil {
		t.Fatal(err)
	}
	shoot(t, page, filepath.Join(dir, "trace.png"))

	// The dashboard.
	charts := dashview.Evaluate(dash, rec)
	if len(charts) != len(dash.MosaicLayout.Tiles) || len(charts) < 14 {
		t.Fatalf("%d charts of %d tiles", len(charts), len(dash.MosaicLayout.Tiles))
	}
	for _, c := range charts {
		switch {
		case c.Err != nil:
			t.Errorf("%s: %v", c.Title, c.Err)
		case c.Points() == 0:
			t.Errorf("%s: no data over the run", c.Title)
		}
	}
	page, err = dashview.HTML(dash, rec, charts, fmt.Sprintf("the local stack, %d purchases and a poison message over %.0f s; each tile's PromQL from infra/terraform/telemetry.tf over the metrics a manual reader collected every second",
		purchases, rec.Times()[rec.Len()-1].Sub(rec.Times()[0]).Seconds()))
	if err != nil {
		t.Fatal(err)
	}
	shoot(t, page, filepath.Join(dir, "dashboard.png"))
}

func snapshot(mu *sync.Mutex, rm *metricdata.ResourceMetrics) metricdata.ResourceMetrics {
	mu.Lock()
	defer mu.Unlock()
	return *rm
}

// lagCount is how many applies of the projection recorded a version lag
// above 0 (the lagged member's version 5 is the run's only one).
func lagCount(rm metricdata.ResourceMetrics) uint64 {
	var n uint64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if d, ok := m.Data.(metricdata.Histogram[int64]); ok && m.Name == telemetry.MetricProjectionVersionLag {
				for _, p := range d.DataPoints {
					n += p.Count - p.BucketCounts[0]
				}
			}
		}
	}
	return n
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// shoot renders page in Chromium and writes the PNG to path.
func shoot(t *testing.T, page []byte, path string) {
	t.Helper()
	b, err := screenshot.PNG(context.Background(), page, screenshot.Options{Width: 1400})
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("%s: not a PNG: %v", path, err)
	}
	if w := img.Bounds().Dx(); w != 1400 {
		t.Errorf("%s is %d px wide, want 1400", path, w)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s (%dx%d)", path, img.Bounds().Dx(), img.Bounds().Dy())
}
