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

// Sampler is relaybus's sampling policy:
//
//   - a span whose parent is in this process follows its parent, so a trace
//     is recorded whole or not at all;
//   - every other span (a root, or one continuing a remote parent: a
//     publish request, a delivery, a relay's drain) is sampled by its trace
//     id at ratio, the parent's sampled flag ignored. The decision depends
//     only on the trace id, so every relaybus process decides the same for
//     one trace: a trace sampled at publish is sampled at every consumer,
//     and none is recorded by halves. The incoming flag is ignored because
//     Cloud Run sets it on about 0.1 request/s per instance
//     (https://cloud.google.com/run/docs/trace), which would drop almost
//     everything;
//   - a span started with ForceSample=true, or linked to a sampled span
//     (the relay's publish span, linked to the rows' producers), is
//     sampled.
//
// With ratio 0 only forced and linked spans are recorded.
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
