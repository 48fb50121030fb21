package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/relaybus/relaybus/internal/traceparent"
)

// Semantic-convention attribute keys and values relaybus uses
// (https://opentelemetry.io/docs/specs/semconv/messaging/).
const (
	KeySystem        = attribute.Key("messaging.system")
	KeyDestination   = attribute.Key("messaging.destination.name")
	KeySubscription  = attribute.Key("messaging.destination.subscription.name")
	KeyOperationName = attribute.Key("messaging.operation.name")
	KeyOperationType = attribute.Key("messaging.operation.type")
	KeyBatchCount    = attribute.Key("messaging.batch.message_count")
	KeyMessageID     = attribute.Key("messaging.message.id")
	KeyErrorType     = attribute.Key("error.type")
	// SystemPubSub is messaging.system for Google Cloud Pub/Sub.
	SystemPubSub = "gcp_pubsub"

	// relaybus's own span attributes.
	KeyEventID   = attribute.Key("relaybus.event.id")
	KeyEventType = attribute.Key("relaybus.event.type")
	KeyConsumer  = attribute.Key("relaybus.consumer")
	KeyOutcome   = attribute.Key("relaybus.outcome")
	KeyAttempt   = attribute.Key("relaybus.attempt")
	// ForceSample is the span attribute that makes relaybus's sampler
	// (internal/otelsetup's Sampler) record a root span whatever the ratio
	// (an operator's replay or re-push).
	ForceSample = attribute.Key("relaybus.sample.force")
)

// Span is a span relaybus started, or nothing when telemetry is off or the
// trace is not sampled (every method is then a no-op).
type Span struct{ s trace.Span }

// Recording reports whether the span records (telemetry on, sampled): add
// costly attributes only then.
func (s Span) Recording() bool { return s.s != nil && s.s.IsRecording() }

// SetAttributes adds attributes to a recording span.
func (s Span) SetAttributes(kv ...attribute.KeyValue) {
	if s.Recording() {
		s.s.SetAttributes(kv...)
	}
}

// End ends the span, marking it failed with err's message when err is not
// nil.
func (s Span) End(err error) {
	if s.s == nil {
		return
	}
	if err != nil && s.s.IsRecording() {
		s.s.RecordError(err)
		s.s.SetStatus(codes.Error, err.Error())
	}
	s.s.End()
}

// Fail marks the span failed with a short description (an outcome that is
// not a Go error: a dead letter, a redelivery).
func (s Span) Fail(desc string) {
	if s.Recording() {
		s.s.SetStatus(codes.Error, desc)
	}
}

// Start starts a span of the given kind under ctx's span (or, with
// parent set, under that remote parent, a W3C traceparent: a request's
// header, a message's attribute). With telemetry off it returns ctx unchanged and an
// empty Span, allocating nothing.
func Start(ctx context.Context, name string, kind trace.SpanKind, parent string, attrs ...attribute.KeyValue) (context.Context, Span) {
	st := current.Load()
	if st == nil {
		return ctx, Span{}
	}
	if parent != "" {
		ctx = traceparent.ContextWith(ctx, parent)
	}
	ctx, s := st.tracer.Start(ctx, name, trace.WithSpanKind(kind), trace.WithAttributes(attrs...))
	return ctx, Span{s}
}

// StartLinked starts a span linked to the span contexts of traceparents
// (the relay's publish of a run of rows, each enqueued by its own
// producer); a link to a sampled trace makes the span sampled. With
// telemetry off it does nothing.
func StartLinked(ctx context.Context, name string, kind trace.SpanKind, traceparents []string, attrs ...attribute.KeyValue) (context.Context, Span) {
	st := current.Load()
	if st == nil {
		return ctx, Span{}
	}
	links := make([]trace.Link, 0, len(traceparents))
	for _, tp := range traceparents {
		if sc, ok := traceparent.Parse(tp); ok {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	ctx, s := st.tracer.Start(ctx, name, trace.WithSpanKind(kind), trace.WithAttributes(attrs...), trace.WithLinks(links...))
	return ctx, Span{s}
}

// Span kinds, re-exported so callers need not import the trace API.
const (
	KindInternal = trace.SpanKindInternal
	KindServer   = trace.SpanKindServer
	KindProducer = trace.SpanKindProducer
	KindConsumer = trace.SpanKindConsumer
	KindClient   = trace.SpanKindClient
)
