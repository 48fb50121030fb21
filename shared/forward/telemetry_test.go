package forward_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/relaybus/relaybus/shared/forward"
)

// The forwarder sends the consume span's context when there is one (the
// endpoint's spans join the event's trace under the delivery), else one
// built from the event's ids.
func TestTheForwardedTraceparentIsTheDeliverySpans(t *testing.T) {
	h, err := forward.New(forward.Options{URL: "http://127.0.0.1:1/"})
	if err != nil {
		t.Fatal(err)
	}
	c := ctxFor()
	c.Event.TraceID, c.Event.SpanID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	req, err := h.Request(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	if got := req.Header.Get("Traceparent"); got != "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" {
		t.Errorf("without a span: %q, want the event's ids", got)
	}
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("b7ad6b7169203331")
	ctx := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid}))
	req, err = h.Request(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if got := req.Header.Get("Traceparent"); got != "00-4bf92f3577b34da6a3ce929d0e0e4736-b7ad6b7169203331-00" {
		t.Errorf("under a delivery span: %q, want the span's context", got)
	}
}
