package telemetry

import (
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// ForceSample is the span attribute that makes Sampler record a root span
// whatever the ratio (an operator's replay or re-push).
const ForceSample = attribute.Key("relaybus.sample.force")

// Sampler is relaybus's sampling policy. The decision is made once, at the
// root of a business operation, and travels with its events:
//
//   - a span whose parent is in this process follows its parent;
//   - a delivery (a consumer span) continuing a remote parent follows that
//     parent's sampled flag: the producer's decision, stored with the outbox
//     row at enqueue and carried by the message, so a trace is recorded
//     whole (publish, every consumer, every child) or not at all;
//   - every other span (a root, or a request continuing its caller's
//     traceparent: publish) is sampled by its trace id at ratio, the
//     caller's flag ignored: Cloud Run sets it on about 0.1 request/s per
//     instance (https://cloud.google.com/run/docs/trace), which would drop
//     almost everything. The decision depends only on the trace id, so two
//     relaybus processes decide the same for one trace;
//   - a span started with ForceSample=true, or linked to a sampled span
//     (the relay's publish span, linked to its rows' producers), is
//     sampled; a forced root's events are then recorded at every consumer.
//
// With ratio 0 only forced and linked spans, and what they cause, are
// recorded.
func Sampler(ratio float64) sdktrace.Sampler {
	return sampler{ratio: sdktrace.TraceIDRatioBased(ratio), desc: fmt.Sprintf("RelaybusSampler{%g}", ratio)}
}

type sampler struct {
	ratio sdktrace.Sampler
	desc  string
}

func (s sampler) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	psc := trace.SpanContextFromContext(p.ParentContext)
	if psc.IsValid() && !psc.IsRemote() {
		d := sdktrace.Drop
		if psc.IsSampled() {
			d = sdktrace.RecordAndSample
		}
		return sdktrace.SamplingResult{Decision: d, Tracestate: psc.TraceState()}
	}
	if psc.IsValid() && p.Kind == trace.SpanKindConsumer {
		d := sdktrace.Drop
		if psc.IsSampled() {
			d = sdktrace.RecordAndSample
		}
		return sdktrace.SamplingResult{Decision: d, Tracestate: psc.TraceState()}
	}
	for _, a := range p.Attributes {
		if a.Key == ForceSample && a.Value.AsBool() {
			return sdktrace.SamplingResult{Decision: sdktrace.RecordAndSample, Tracestate: psc.TraceState()}
		}
	}
	for _, l := range p.Links {
		if l.SpanContext.IsSampled() {
			return sdktrace.SamplingResult{Decision: sdktrace.RecordAndSample, Tracestate: psc.TraceState()}
		}
	}
	return s.ratio.ShouldSample(p)
}

func (s sampler) Description() string { return s.desc }
