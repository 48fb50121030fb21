// Package traceparent formats and parses the W3C traceparent an event
// carries from its producer to its consumers. It imports the OpenTelemetry
// trace API and nothing else of OpenTelemetry, so a producer that stamps
// the traceparent on what it enqueues (shared/outbox) links no exporter,
// propagator or net/http because of it.
package traceparent

import (
	"context"
	"encoding/hex"

	"go.opentelemetry.io/otel/trace"
)

// FromContext returns the W3C traceparent of ctx's span
// ("00-<trace id>-<span id>-<flags>"), or "" when ctx has no valid span
// (telemetry off, or nothing started).
func FromContext(ctx context.Context) string {
	return Format(trace.SpanContextFromContext(ctx))
}

// Format formats sc as a W3C traceparent; "" when sc is invalid.
func Format(sc trace.SpanContext) string {
	if !sc.IsValid() {
		return ""
	}
	var b [55]byte
	tid, sid := sc.TraceID(), sc.SpanID()
	b[0], b[1], b[2] = '0', '0', '-'
	hex.Encode(b[3:35], tid[:])
	b[35] = '-'
	hex.Encode(b[36:52], sid[:])
	b[52] = '-'
	b[53], b[54] = '0', '0'
	if sc.IsSampled() {
		b[54] = '1'
	}
	return string(b[:])
}

// Parse reads a W3C traceparent into a remote span context; ok
// is false when s is not a valid one (the W3C rules: version ff or a
// malformed or all-zero id is invalid; a future version may append fields).
func Parse(s string) (trace.SpanContext, bool) {
	if len(s) < 55 || (len(s) > 55 && (s[:2] == "00" || s[55] != '-')) || s[2] != '-' || s[35] != '-' || s[52] != '-' || s[:2] == "ff" {
		return trace.SpanContext{}, false
	}
	var (
		tid   trace.TraceID
		sid   trace.SpanID
		flags [1]byte
		ver   [1]byte
	)
	if !lowerHex(s[:2]) || !lowerHex(s[3:35]) || !lowerHex(s[36:52]) || !lowerHex(s[53:55]) {
		return trace.SpanContext{}, false
	}
	if _, err := hex.Decode(ver[:], []byte(s[:2])); err != nil {
		return trace.SpanContext{}, false
	}
	if _, err := hex.Decode(tid[:], []byte(s[3:35])); err != nil {
		return trace.SpanContext{}, false
	}
	if _, err := hex.Decode(sid[:], []byte(s[36:52])); err != nil {
		return trace.SpanContext{}, false
	}
	if _, err := hex.Decode(flags[:], []byte(s[53:55])); err != nil {
		return trace.SpanContext{}, false
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid,
		TraceFlags: trace.TraceFlags(flags[0]) & trace.FlagsSampled, Remote: true})
	return sc, sc.IsValid()
}

func lowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')) {
			return false
		}
	}
	return true
}

// ContextWith returns ctx with tp as its remote parent span
// context, or ctx itself when tp is not a valid traceparent.
func ContextWith(ctx context.Context, tp string) context.Context {
	if tp == "" {
		return ctx
	}
	sc, ok := Parse(tp)
	if !ok {
		return ctx
	}
	return trace.ContextWithRemoteSpanContext(ctx, sc)
}
