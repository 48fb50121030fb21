package traceparent_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/relaybus/relaybus/internal/traceparent"
)

func TestTraceparentRoundTripsAndRefusesWhatW3CRefuses(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	sc, ok := traceparent.Parse(tp)
	if !ok || !sc.IsRemote() || !sc.IsSampled() || sc.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || sc.SpanID().String() != "00f067aa0ba902b7" {
		t.Fatalf("parse %s: %v %v", tp, sc, ok)
	}
	if got := traceparent.Format(sc); got != tp {
		t.Errorf("format: %s, want %s", got, tp)
	}
	if got := traceparent.Format(trace.SpanContext{}); got != "" {
		t.Errorf("format of no span: %q", got)
	}
	for _, bad := range []string{
		"", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7", // too short
		"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",   // version ff
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01",   // zero trace id
		"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",   // zero span id
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",   // upper case
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x", // version 00 with more
		"00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
	} {
		if _, ok := traceparent.Parse(bad); ok {
			t.Errorf("%q parsed as valid", bad)
		}
	}
	// A future version may append fields.
	if _, ok := traceparent.Parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"); !ok {
		t.Error("a future version's traceparent was refused")
	}
}

// A context carries a valid traceparent as its remote parent, and one
// that is not valid leaves the context as it was.
func TestContextWithCarriesOnlyAValidTraceparent(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	ctx := traceparent.ContextWith(context.Background(), tp)
	if got := traceparent.FromContext(ctx); got != tp {
		t.Errorf("FromContext after ContextWith(%s) = %q", tp, got)
	}
	for _, bad := range []string{"", "not-a-traceparent"} {
		if got := traceparent.FromContext(traceparent.ContextWith(context.Background(), bad)); got != "" {
			t.Errorf("ContextWith(%q) gave the context the traceparent %q", bad, got)
		}
	}
}
