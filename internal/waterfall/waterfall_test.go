package waterfall

import (
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// A request, a delivery under it with a failed handler, and a span of
// another trace linking to the delivery: drawn depth first by start time,
// the linked span under the span it links to, offsets from the first
// start, each service its colour.
func TestRowsAndHTML(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	tid, other := trace.TraceID{1}, trace.TraceID{2}
	sc := func(tr trace.TraceID, id byte) trace.SpanContext {
		return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tr, SpanID: trace.SpanID{id}, TraceFlags: trace.FlagsSampled})
	}
	spans := tracetest.SpanStubs{
		{Name: "handle", SpanContext: sc(tid, 3), Parent: sc(tid, 2), SpanKind: trace.SpanKindInternal,
			StartTime: t0.Add(20 * time.Millisecond), EndTime: t0.Add(30 * time.Millisecond), Status: sdktrace.Status{Code: codes.Error}},
		{Name: "publish", SpanContext: sc(tid, 1), SpanKind: trace.SpanKindServer, StartTime: t0, EndTime: t0.Add(100 * time.Millisecond)},
		{Name: "publish child", SpanContext: sc(other, 9), SpanKind: trace.SpanKindProducer, StartTime: t0.Add(40 * time.Millisecond),
			EndTime: t0.Add(41 * time.Millisecond), Links: []sdktrace.Link{{SpanContext: sc(tid, 2)}}},
		{Name: "process", SpanContext: sc(tid, 2), Parent: sc(tid, 1), SpanKind: trace.SpanKindConsumer,
			StartTime: t0.Add(10 * time.Millisecond), EndTime: t0.Add(50 * time.Millisecond),
			Attributes: []attribute.KeyValue{attribute.String("relaybus.consumer", "audit"), attribute.String("relaybus.outcome", "retry")}},
		{Name: "unrelated", SpanContext: sc(other, 8), StartTime: t0, EndTime: t0.Add(time.Millisecond)},
	}
	rows := Rows(tid, spans, Options{})
	got := ""
	for _, r := range rows {
		got += strings.Repeat(".", r.Depth) + r.Name + "/" + r.Service + "/" + r.Start.String()
		if r.Linked {
			got += "/linked"
		}
		if r.Error {
			got += "/error"
		}
		got += " "
	}
	want := "publish/publish/0s .process/audit/10ms ..handle/audit/20ms/error ..publish child/relay/40ms/linked "
	if got != want {
		t.Fatalf("rows\n got %s\nwant %s", got, want)
	}
	b, err := HTML(tid, spans, Options{})
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	for _, w := range []string{"4 spans", "100 ms", "audit · retry", "↪ linked", "bar error", "background:#1a73e8", "background:#e8710a"} {
		if !strings.Contains(page, w) {
			t.Errorf("the page lacks %q", w)
		}
	}
	if strings.Contains(page, "ZgotmplZ") || strings.Contains(page, "unrelated") {
		t.Error("the page has an unsafe value or another trace's unlinked span")
	}
}
