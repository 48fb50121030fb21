// Package waterfall draws one trace as a person sees it in Cloud Trace: a
// waterfall of its spans on a common time axis, each under its parent, with
// the spans of other traces that link to one of them (the relay's publish
// of a child event) drawn under the span they link to. It renders the
// spans an OpenTelemetry exporter received (tracetest.SpanStubs) as a
// self-contained HTML page; docs/telemetry.md's picture of a purchase's trace is
// that page, shot by internal/screenshot.
package waterfall

import (
	"bytes"
	"fmt"
	"html/template"
	"math"
	"sort"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// Row is one span as drawn: its place in the tree and on the time axis.
type Row struct {
	Name    string
	Kind    string
	Depth   int
	Service string // who ran it (see Options.Service)
	Detail  string // the consumer and outcome, when the span has them
	Linked  bool   // a span of another trace linking to its parent row
	Error   bool
	Start   time.Duration // since the first span's start
	Length  time.Duration
}

// Options say how a trace is drawn.
type Options struct {
	// Title heads the page (default "Trace <id>").
	Title string
	// Service names who ran a span (the bar's colour and label); default:
	// the span's relaybus.consumer, else "relay" for a producer span (a
	// Pub/Sub publish), else the span's name for a root, else its parent's
	// service. A span it returns "" for inherits its parent's.
	Service func(tracetest.SpanStub) string
	// Keep, when set, drops the spans it returns false for (their children
	// go with them).
	Keep func(tracetest.SpanStub) bool
}

// Rows returns the spans of trace id in all, depth first (children by
// start time), with the spans of other traces that link to one of them
// drawn under the span they link to.
func Rows(id trace.TraceID, all tracetest.SpanStubs, o Options) []Row {
	in := map[trace.SpanID]bool{}
	var spans tracetest.SpanStubs
	for _, sp := range all {
		if sp.SpanContext.TraceID() == id && (o.Keep == nil || o.Keep(sp)) {
			in[sp.SpanContext.SpanID()] = true
			spans = append(spans, sp)
		}
	}
	children := map[trace.SpanID][]tracetest.SpanStub{}
	var roots []tracetest.SpanStub
	for _, sp := range spans {
		if in[sp.Parent.SpanID()] {
			children[sp.Parent.SpanID()] = append(children[sp.Parent.SpanID()], sp)
		} else {
			roots = append(roots, sp)
		}
	}
	linked := map[trace.SpanID][]tracetest.SpanStub{}
	for _, sp := range all {
		if sp.SpanContext.TraceID() == id || (o.Keep != nil && !o.Keep(sp)) {
			continue
		}
		for _, l := range sp.Links {
			if in[l.SpanContext.SpanID()] {
				linked[l.SpanContext.SpanID()] = append(linked[l.SpanContext.SpanID()], sp)
				break
			}
		}
	}
	var start time.Time
	for _, sp := range spans {
		if start.IsZero() || sp.StartTime.Before(start) {
			start = sp.StartTime
		}
	}
	var rows []Row
	var walk func(sp tracetest.SpanStub, depth int, service string, isLinked bool)
	walk = func(sp tracetest.SpanStub, depth int, service string, isLinked bool) {
		svc := ""
		if o.Service != nil {
			svc = o.Service(sp)
		} else if c := attr(sp, "relaybus.consumer"); c != "" {
			svc = c
		} else if sp.SpanKind == trace.SpanKindProducer {
			svc = "relay"
		} else if depth == 0 {
			svc = sp.Name
		}
		if svc == "" {
			svc = service
		}
		detail := attr(sp, "relaybus.consumer")
		if out := attr(sp, "relaybus.outcome"); out != "" {
			detail += " · " + out
		}
		rows = append(rows, Row{Name: sp.Name, Kind: kind(sp.SpanKind), Depth: depth, Service: svc, Detail: detail, Linked: isLinked,
			Error: sp.Status.Code == codes.Error, Start: sp.StartTime.Sub(start), Length: sp.EndTime.Sub(sp.StartTime)})
		kids := append(append([]tracetest.SpanStub(nil), children[sp.SpanContext.SpanID()]...), linked[sp.SpanContext.SpanID()]...)
		sort.SliceStable(kids, func(i, j int) bool { return kids[i].StartTime.Before(kids[j].StartTime) })
		for _, k := range kids {
			walk(k, depth+1, svc, k.SpanContext.TraceID() != id)
		}
	}
	sort.SliceStable(roots, func(i, j int) bool { return roots[i].StartTime.Before(roots[j].StartTime) })
	for _, r := range roots {
		walk(r, 0, "", false)
	}
	return rows
}

func attr(sp tracetest.SpanStub, k attribute.Key) string {
	for _, kv := range sp.Attributes {
		if kv.Key == k {
			return kv.Value.String()
		}
	}
	return ""
}

func kind(k trace.SpanKind) string {
	switch k {
	case trace.SpanKindServer:
		return "server"
	case trace.SpanKindClient:
		return "client"
	case trace.SpanKindProducer:
		return "producer"
	case trace.SpanKindConsumer:
		return "consumer"
	}
	return "internal"
}

// palette colours services in the order they first appear.
var palette = []string{"#1a73e8", "#e8710a", "#188038", "#a142f4", "#d01884", "#12b5cb", "#f9ab00", "#5f6368"}

// HTML renders the trace id of all as a waterfall page.
func HTML(id trace.TraceID, all tracetest.SpanStubs, o Options) ([]byte, error) {
	rows := Rows(id, all, o)
	var total time.Duration
	for _, r := range rows {
		total = max(total, r.Start+r.Length)
	}
	if total <= 0 {
		total = time.Millisecond
	}
	colour := map[string]template.CSS{}
	var legend []legendItem
	type drawn struct {
		Row
		Indent, Left, Width float64
		Colour              template.CSS
		Duration            string
	}
	out := make([]drawn, len(rows))
	for i, r := range rows {
		c, ok := colour[r.Service]
		if !ok {
			c = template.CSS(palette[len(colour)%len(palette)])
			colour[r.Service] = c
			legend = append(legend, legendItem{r.Service, c})
		}
		left := 100 * float64(r.Start) / float64(total)
		width := math.Max(100*float64(r.Length)/float64(total), 0.15)
		out[i] = drawn{Row: r, Indent: float64(r.Depth) * 14, Left: left, Width: math.Min(width, 100-left), Colour: c, Duration: ms(r.Length)}
	}
	title := o.Title
	if title == "" {
		title = "Trace " + id.String()
	}
	var ticks []tick
	step := niceStep(total)
	for t := time.Duration(0); t <= total; t += step {
		ticks = append(ticks, tick{Left: 100 * float64(t) / float64(total), Label: ms(t)})
	}
	var b bytes.Buffer
	err := page.Execute(&b, map[string]any{"Title": title, "Trace": id.String(), "Rows": out, "Spans": len(rows),
		"Total": ms(total), "Legend": legend, "Ticks": ticks})
	return b.Bytes(), err
}

type legendItem struct {
	Name   string
	Colour template.CSS
}

type tick struct {
	Left  float64
	Label string
}

func ms(d time.Duration) string {
	f := float64(d.Microseconds()) / 1000
	switch {
	case f == 0:
		return "0"
	case f >= 10000:
		return fmt.Sprintf("%.1f s", f/1000)
	case f >= 1000:
		return fmt.Sprintf("%.2f s", f/1000)
	case f >= 100:
		return fmt.Sprintf("%.0f ms", f)
	case f >= 10:
		return fmt.Sprintf("%.1f ms", f)
	}
	return fmt.Sprintf("%.2f ms", f)
}

// niceStep is a tick interval giving about 8 ticks over total: 1, 2 or 5
// times a power of ten of milliseconds.
func niceStep(total time.Duration) time.Duration {
	raw := float64(total) / 8
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= raw {
			return time.Duration(m * p)
		}
	}
	return time.Duration(10 * p)
}

var page = template.Must(template.New("waterfall").Parse(`<!doctype html>
<html><head><meta charset="utf-8"><title>{{.Title}}</title>
<style>
body { font: 13px/1.35 Roboto, "Noto Sans", "DejaVu Sans", Arial, sans-serif; color: #202124; margin: 0; background: #f8f9fa; }
header { background: #fff; border-bottom: 1px solid #dadce0; padding: 14px 24px; }
h1 { font-size: 18px; font-weight: 500; margin: 0 0 4px; }
.meta { color: #5f6368; }
.legend span { display: inline-block; margin-right: 14px; }
.legend i { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 5px; vertical-align: -1px; }
main { background: #fff; margin: 16px 24px; border: 1px solid #dadce0; border-radius: 8px; overflow: hidden; }
.row { display: flex; align-items: center; height: 24px; border-bottom: 1px solid #f1f3f4; }
.row.head { height: 28px; background: #f8f9fa; color: #5f6368; font-size: 11px; }
.name { width: 520px; flex: none; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; padding-left: 10px; }
.name b { font-weight: 500; }
.name .k { color: #80868b; font-size: 11px; margin-left: 4px; }
.name .d { color: #5f6368; margin-left: 6px; }
.name .l { color: #a142f4; font-size: 11px; margin-right: 4px; }
.lane { position: relative; flex: 1; height: 100%; margin-right: 90px; }
.bar { position: absolute; top: 6px; height: 12px; border-radius: 2px; }
.bar.linked { opacity: .75; outline: 1px dashed #a142f4; outline-offset: 1px; }
.bar.error { outline: 2px solid #d93025; }
.dur { position: absolute; top: 4px; font-size: 11px; color: #5f6368; white-space: nowrap; padding-left: 6px; }
.tick { position: absolute; top: 0; bottom: 0; border-left: 1px solid #e8eaed; padding-left: 3px; line-height: 28px; white-space: nowrap; }
</style></head><body>
<header><h1>{{.Title}}</h1>
<div class="meta">trace {{.Trace}} · {{.Spans}} spans · {{.Total}}</div>
<div class="legend">{{range .Legend}}<span><i style="background:{{.Colour}}"></i>{{.Name}}</span>{{end}}</div></header>
<main>
<div class="row head"><div class="name">span</div><div class="lane">{{range .Ticks}}<div class="tick" style="left:{{printf "%.3f" .Left}}%">{{.Label}}</div>{{end}}</div></div>
{{range .Rows}}<div class="row"><div class="name" style="padding-left:{{printf "%.0f" .Indent}}px">{{if .Linked}}<span class="l">↪ linked</span>{{end}}<b>{{.Name}}</b><span class="k">{{.Kind}}</span>{{if .Detail}}<span class="d">{{.Detail}}</span>{{end}}</div>
<div class="lane"><div class="bar{{if .Linked}} linked{{end}}{{if .Error}} error{{end}}" style="left:{{printf "%.3f" .Left}}%;width:{{printf "%.3f" .Width}}%;background:{{.Colour}}"></div><div class="dur" style="left:{{printf "%.3f" .Left}}%;margin-left:{{printf "%.3f" .Width}}%">{{.Duration}}</div></div></div>
{{end}}</main></body></html>
`))
