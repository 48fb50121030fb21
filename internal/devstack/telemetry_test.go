package devstack

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/relaybus/relaybus/internal/eventually"
	"github.com/relaybus/relaybus/internal/otelsetup"
	"github.com/relaybus/relaybus/internal/telemetry"
	"github.com/relaybus/relaybus/shared/broker/pubsub"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
)

// One purchase on the local stack, with telemetry recording into memory:
// one trace holds publish's request span, the relay's publish (linked to
// the request), both consumers' deliveries (message-service's redelivery
// too) and their handlers, both child events' publishes (linked to the
// handler that emitted them) and audit-service's deliveries, each under
// the span that caused it; the metrics count every hop exactly.
func TestOnePurchaseIsOneTraceAndItsMetricsCountEveryHop(t *testing.T) {
	ctx := context.Background()
	spans := tracetest.NewInMemoryExporter()
	tp := otelsetup.NewTracerProvider(1, nil, sdktrace.WithSyncer(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	restore := telemetry.Install(tp, mp)
	defer restore()

	s := startOnTestSchema(t, 500*time.Millisecond)
	defer closeStack(s)

	run := event.NewID()[:8]
	orderID := "order-" + run
	body, _ := json.Marshal(map[string]any{
		"eventType": "order.purchased", "topic": "shop.order.events", "aggregateType": "order",
		"aggregateId": orderID, "version": 1, "source": "order-service",
		"payload": map[string]any{"orderId": orderID, "memberId": "member-" + run, "amount": 120, "failFirstNotify": true},
	})
	resp, err := http.Post(s.Info.URL+"/publish", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var res struct{ EventID, TraceID string }
	_ = json.NewDecoder(resp.Body).Decode(&res)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("publish answered %d", resp.StatusCode)
	}

	// A poison message (no aggregate id) straight onto the topic: both
	// consumers dead-letter it and count the missing id.
	ps, err := pubsub.Dial(ctx, s.Info.Project, s.Info.PubSubHost, pubsub.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ps.Close()
	if _, err := ps.Publish(ctx, "shop.order.events", event.Message{Data: []byte(`{"note":"no aggregate id"}`),
		Attributes: map[string]string{"event_id": "poison-" + run, "event_type": "order.purchased"}}); err != nil {
		t.Fatal(err)
	}

	// Wait for the last hops: audit-service applying both children, and both
	// consumers dead-lettering the poison message.
	done := func(ss tracetest.SpanStubs) bool {
		audit, poison := 0, 0
		for _, sp := range ss {
			switch attr(sp, telemetry.KeyOutcome) {
			case "success":
				if attr(sp, telemetry.KeyConsumer) == "audit-service" && sp.SpanKind == trace.SpanKindConsumer {
					audit++
				}
			case "poison":
				poison++
			}
		}
		return audit == 2 && poison == 2
	}
	if !eventually.Within(90*time.Second, func() bool { return done(spans.GetSpans()) }) {
		dump(t, spans.GetSpans())
		t.Fatal("the purchase's last deliveries never showed up as spans")
	}

	var (
		all      = spans.GetSpans()
		byID     = map[trace.SpanID]tracetest.SpanStub{}
		inTrace  []tracetest.SpanStub
		request  tracetest.SpanStub
		process  = map[string][]tracetest.SpanStub{} // consumer/topic → its deliveries
		handlers = map[string]tracetest.SpanStub{}   // consumer/topic → the successful attempt's handler
		publish  = map[string][]tracetest.SpanStub{} // topic → the relay's publish spans
	)
	for _, sp := range all {
		if sp.SpanContext.TraceID().String() != res.TraceID {
			continue
		}
		inTrace = append(inTrace, sp)
		byID[sp.SpanContext.SpanID()] = sp
		if n := len(sp.Attributes); n > 32 {
			t.Errorf("span %s has %d attributes, over Cloud Trace's 32", sp.Name, n)
		}
		for _, kv := range sp.Attributes {
			if kv.Value.Type() == attribute.STRING && len(kv.Value.AsString()) > 256 {
				t.Errorf("span %s: attribute %s is over 256 bytes", sp.Name, kv.Key)
			}
		}
	}
	for _, sp := range all {
		key := attr(sp, telemetry.KeyConsumer) + "/" + attr(sp, telemetry.KeyDestination)
		switch {
		case sp.Name == "publish" && sp.SpanKind == trace.SpanKindServer && sp.SpanContext.TraceID().String() == res.TraceID:
			request = sp
		case sp.SpanKind == trace.SpanKindConsumer && sp.SpanContext.TraceID().String() == res.TraceID:
			process[key] = append(process[key], sp)
		case sp.SpanKind == trace.SpanKindProducer:
			publish[attr(sp, telemetry.KeyDestination)] = append(publish[attr(sp, telemetry.KeyDestination)], sp)
		}
	}
	if !request.SpanContext.IsValid() || request.Parent.IsValid() {
		t.Fatalf("publish's request span is not the trace's root: %+v", request.Parent)
	}
	// The handlers of the successful attempts (a handler span's parent is a
	// delivery).
	for _, sp := range inTrace {
		if sp.SpanKind != trace.SpanKindInternal || sp.Status.Code != 0 {
			continue
		}
		p, ok := byID[sp.Parent.SpanID()]
		if !ok || attr(p, telemetry.KeyOutcome) != "success" {
			continue
		}
		handlers[attr(p, telemetry.KeyConsumer)+"/"+attr(p, telemetry.KeyDestination)] = sp
	}

	// The order: published by the request (the fast path's publish is its
	// child and links to it), delivered to both consumers under it;
	// message-service's first attempt asked for a redelivery.
	wantOutcomes := map[string][]string{
		"member-service/shop.order.events":          {"success"},
		"message-service/shop.order.events":         {"retry", "success"},
		"audit-service/member.points.events":        {"success"},
		"audit-service/message.notification.events": {"success"},
	}
	for key, want := range wantOutcomes {
		got := process[key]
		var outcomes []string
		for _, sp := range got {
			outcomes = append(outcomes, attr(sp, telemetry.KeyOutcome))
		}
		if fmt.Sprint(outcomes) != fmt.Sprint(want) {
			t.Errorf("%s: deliveries %v, want %v", key, outcomes, want)
		}
	}
	for _, key := range []string{"member-service/shop.order.events", "message-service/shop.order.events"} {
		for _, sp := range process[key] {
			if sp.Parent.SpanID() != request.SpanContext.SpanID() || !sp.Parent.IsRemote() {
				t.Errorf("%s: delivery's parent is %s, want the publish request %s (remote)", key, sp.Parent.SpanID(), request.SpanContext.SpanID())
			}
		}
		if h, ok := handlers[key]; !ok || h.Name != "handle order.purchased" {
			t.Errorf("%s: no handler span under the successful delivery (%+v)", key, h.Name)
		}
	}
	if !linksTo(publish["shop.order.events"], request.SpanContext) {
		t.Errorf("no relay publish of shop.order.events links to the request span")
	}
	// The children: enqueued by the handlers, so each child's delivery is
	// under the handler that emitted it, and its relay publish links to it.
	for child, parent := range map[string]string{
		"audit-service/member.points.events":        "member-service/shop.order.events",
		"audit-service/message.notification.events": "message-service/shop.order.events",
	} {
		h := handlers[parent]
		for _, sp := range process[child] {
			if sp.Parent.SpanID() != h.SpanContext.SpanID() {
				t.Errorf("%s: delivery's parent is %s, want %s's handler %s", child, sp.Parent.SpanID(), parent, h.SpanContext.SpanID())
			}
		}
		topic := child[len("audit-service/"):]
		if !linksTo(publish[topic], h.SpanContext) {
			t.Errorf("no relay publish of %s links to %s's handler", topic, parent)
		}
	}
	if t.Failed() {
		dump(t, all)
	}
	t.Log("the purchase's trace, as the exporter received it:\n" + render(inTrace, all))

	// The metrics, exactly.
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	consumed := sums(rm, telemetry.MetricConsumedMessages, telemetry.KeyConsumer, telemetry.KeyDestination, telemetry.KeyOutcome)
	for k, want := range map[string]int64{
		"member-service/shop.order.events/success":          1,
		"member-service/shop.order.events/poison":           1,
		"message-service/shop.order.events/retry":           1,
		"message-service/shop.order.events/success":         1,
		"message-service/shop.order.events/poison":          1,
		"audit-service/member.points.events/success":        1,
		"audit-service/message.notification.events/success": 1,
	} {
		if consumed[k] != want {
			t.Errorf("%s %s = %d, want %d (all: %v)", telemetry.MetricConsumedMessages, k, consumed[k], want, consumed)
		}
	}
	sent := sums(rm, telemetry.MetricSentMessages, telemetry.KeyDestination, telemetry.KeyErrorType)
	for _, topic := range []string{"shop.order.events", "member.points.events", "message.notification.events"} {
		if sent[topic+"/"] != 1 {
			t.Errorf("%s %s = %d, want 1 (all: %v)", telemetry.MetricSentMessages, topic, sent[topic+"/"], sent)
		}
	}
	invalid := sums(rm, telemetry.MetricAggregateIDInvalid, telemetry.KeyDestination, telemetry.KeyReason)
	if got := invalid["shop.order.events/"+event.ReasonMissingAggregateID]; got != 2 {
		t.Errorf("%s = %v, want 2 missing ids on shop.order.events", telemetry.MetricAggregateIDInvalid, invalid)
	}
	source := sums(rm, telemetry.MetricAggregateIDSource, telemetry.KeyDestination, telemetry.KeySource)
	if got := source["shop.order.events/"+event.FromEnvelope]; got != 3 {
		t.Errorf("%s = %v, want 3 ids from the envelope on shop.order.events (3 deliveries)", telemetry.MetricAggregateIDSource, source)
	}
	hops := counts(rm, telemetry.MetricHopDuration, telemetry.KeyHop, telemetry.KeyDestination, telemetry.KeyConsumer)
	for k, want := range map[string]uint64{
		"enqueue_to_publish/shop.order.events/":                1,
		"publish_to_consume/shop.order.events/member-service":  1,
		"publish_to_consume/shop.order.events/message-service": 1,
		"end_to_end/shop.order.events/message-service":         1,
		"end_to_end/message.notification.events/audit-service": 1,
	} {
		if hops[k] != want {
			t.Errorf("%s %s: %d points, want %d (all: %v)", telemetry.MetricHopDuration, k, hops[k], want, hops)
		}
	}
	// audit-service's projections applied each child, the first version
	// of its aggregate: one point of lag 0 each (the strict one applies
	// through the same upsert), nothing stale.
	lags := map[string]string{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if d, ok := m.Data.(metricdata.Histogram[int64]); ok && m.Name == telemetry.MetricProjectionVersionLag {
				for _, p := range d.DataPoints {
					lags[key(p.Attributes, []attribute.Key{telemetry.KeyDestination, telemetry.KeyConsumer})] = fmt.Sprintf("%d points, sum %d", p.Count, p.Sum)
				}
			}
		}
	}
	wantLags := map[string]string{"member.points.events/audit-service": "1 points, sum 0", "message.notification.events/audit-service": "1 points, sum 0"}
	if fmt.Sprint(lags) != fmt.Sprint(wantLags) {
		t.Errorf("%s: %v, want %v", telemetry.MetricProjectionVersionLag, lags, wantLags)
	}
	if st := sums(rm, telemetry.MetricProjectionStale, telemetry.KeyConsumer); len(st) != 0 {
		t.Errorf("%s: %v, want none", telemetry.MetricProjectionStale, st)
	}
}

func attr(sp tracetest.SpanStub, k attribute.Key) string {
	for _, kv := range sp.Attributes {
		if kv.Key == k {
			return kv.Value.String()
		}
	}
	return ""
}

func linksTo(ss []tracetest.SpanStub, sc trace.SpanContext) bool {
	for _, sp := range ss {
		for _, l := range sp.Links {
			if l.SpanContext.SpanID() == sc.SpanID() && l.SpanContext.TraceID() == sc.TraceID() {
				return true
			}
		}
	}
	return false
}

func dump(t *testing.T, ss tracetest.SpanStubs) {
	for _, sp := range ss {
		t.Logf("%s %s %s parent=%s kind=%s consumer=%s outcome=%s links=%d", sp.SpanContext.TraceID(), sp.SpanContext.SpanID(), sp.Name,
			sp.Parent.SpanID(), sp.SpanKind, attr(sp, telemetry.KeyConsumer), attr(sp, telemetry.KeyOutcome), len(sp.Links))
	}
}

// key joins the values of keys in a data point's attributes with "/".
func key(set attribute.Set, keys []attribute.Key) string {
	s := ""
	for i, k := range keys {
		if i > 0 {
			s += "/"
		}
		v, _ := set.Value(k)
		s += v.String()
	}
	return s
}

func sums(rm metricdata.ResourceMetrics, name string, keys ...attribute.Key) map[string]int64 {
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if d, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == name {
				for _, p := range d.DataPoints {
					out[key(p.Attributes, keys)] += p.Value
				}
			}
		}
	}
	return out
}

func counts(rm metricdata.ResourceMetrics, name string, keys ...attribute.Key) map[string]uint64 {
	out := map[string]uint64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if d, ok := m.Data.(metricdata.Histogram[float64]); ok && m.Name == name {
				for _, p := range d.DataPoints {
					out[key(p.Attributes, keys)] += p.Count
				}
			}
		}
	}
	return out
}

// render draws a trace as an indented tree, each span under its parent,
// with the spans of other traces that link to one of its spans under it
// (marked "linked"), each with its duration.
func render(tr, all tracetest.SpanStubs) string {
	in := map[trace.SpanID]bool{}
	for _, sp := range tr {
		in[sp.SpanContext.SpanID()] = true
	}
	children := map[trace.SpanID][]tracetest.SpanStub{}
	var roots []tracetest.SpanStub
	for _, sp := range tr {
		if in[sp.Parent.SpanID()] {
			children[sp.Parent.SpanID()] = append(children[sp.Parent.SpanID()], sp)
		} else {
			roots = append(roots, sp)
		}
	}
	linked := map[trace.SpanID][]tracetest.SpanStub{}
	for _, sp := range all {
		if in[sp.SpanContext.SpanID()] {
			continue
		}
		for _, l := range sp.Links {
			if in[l.SpanContext.SpanID()] {
				linked[l.SpanContext.SpanID()] = append(linked[l.SpanContext.SpanID()], sp)
			}
		}
	}
	var b strings.Builder
	var walk func(sp tracetest.SpanStub, depth int, mark string)
	walk = func(sp tracetest.SpanStub, depth int, mark string) {
		line := strings.Repeat("  ", depth) + mark + sp.Name + " [" + sp.SpanKind.String() + "]"
		if c := attr(sp, telemetry.KeyConsumer); c != "" {
			line += " " + c
		}
		if o := attr(sp, telemetry.KeyOutcome); o != "" {
			line += " " + o
		}
		fmt.Fprintf(&b, "%-78s %7.1f ms\n", line, float64(sp.EndTime.Sub(sp.StartTime).Microseconds())/1000)
		kids := append(children[sp.SpanContext.SpanID()], linked[sp.SpanContext.SpanID()]...)
		sort.Slice(kids, func(i, j int) bool { return kids[i].StartTime.Before(kids[j].StartTime) })
		for _, k := range kids {
			m := ""
			if k.SpanContext.TraceID() != sp.SpanContext.TraceID() {
				m = "(linked) "
			}
			walk(k, depth+1, m)
		}
	}
	sort.Slice(roots, func(i, j int) bool { return roots[i].StartTime.Before(roots[j].StartTime) })
	for _, r := range roots {
		walk(r, 0, "")
	}
	return b.String()
}

// The sampling decision is made once, at the root, and travels with the
// events: at ratio 0 an HTTP purchase records nothing anywhere, while a Go
// producer's forced root (relaybus.sample.force) is recorded at every
// consumer and child, though each delivery is a root of its own process.
func TestTheRootsSamplingDecisionTravelsWithTheEvents(t *testing.T) {
	ctx := context.Background()
	spans := tracetest.NewInMemoryExporter()
	tp := otelsetup.NewTracerProvider(0, nil, sdktrace.WithSyncer(spans))
	reader := sdkmetric.NewManualReader()
	restore := telemetry.Install(tp, sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	defer restore()

	s := startOnTestSchema(t, 200*time.Millisecond)
	defer closeStack(s)
	run := event.NewID()[:8]
	purchase := func(order string) []byte {
		b, _ := json.Marshal(map[string]any{"orderId": order, "memberId": "member-" + order, "amount": 10})
		return b
	}

	// An HTTP purchase: sampled out at publish, so nowhere.
	body, _ := json.Marshal(map[string]any{
		"eventType": "order.purchased", "topic": "shop.order.events", "aggregateType": "order",
		"aggregateId": "http-" + run, "version": 1, "source": "order-service", "payload": json.RawMessage(purchase("http-" + run)),
	})
	resp, err := http.Post(s.Info.URL+"/publish", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var res struct{ TraceID string }
	_ = json.NewDecoder(resp.Body).Decode(&res)
	resp.Body.Close()

	// A Go producer's checkout, forced.
	rctx, root := tp.Tracer("shop").Start(ctx, "checkout", trace.WithAttributes(telemetry.ForceSample.Bool(true)))
	forced := &event.Event{Type: "order.purchased", Topic: "shop.order.events", AggregateType: "order", AggregateID: "go-" + run,
		Version: 1, Source: "order-service", Payload: purchase("go-" + run)}
	if _, err := outbox.Enqueue(rctx, s.Pool, forced); err != nil {
		t.Fatal(err)
	}
	root.End()
	forcedTrace := root.SpanContext().TraceID()

	// Both purchases done: audit-service applied four children (counted
	// whatever the sampling).
	var c map[string]int64
	if !eventually.Within(90*time.Second, func() bool {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(ctx, &rm); err != nil {
			t.Fatal(err)
		}
		c = sums(rm, telemetry.MetricConsumedMessages, telemetry.KeyConsumer, telemetry.KeyOutcome)
		return c["audit-service/success"] == 4
	}) {
		t.Fatalf("the purchases never finished: %v", c)
	}
	got := map[string]int{}
	for _, sp := range spans.GetSpans() {
		switch sp.SpanContext.TraceID() {
		case forcedTrace:
			if sp.SpanKind == trace.SpanKindConsumer {
				got[attr(sp, telemetry.KeyConsumer)+"/"+attr(sp, telemetry.KeyOutcome)]++
			}
		default:
			if sp.SpanContext.TraceID().String() == res.TraceID {
				t.Errorf("the HTTP purchase, sampled out, recorded %s", sp.Name)
			}
		}
	}
	want := map[string]int{"member-service/success": 1, "message-service/success": 1, "audit-service/success": 2}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("the forced purchase's deliveries: %v, want %v", got, want)
	}
}
