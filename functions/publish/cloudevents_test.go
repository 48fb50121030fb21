package publish_test

import (
	"bytes"
	"context"
	"net/http"
	"testing"
	"time"

	pbformat "github.com/cloudevents/sdk-go/binding/format/protobuf/v2"
	cloudevents "github.com/cloudevents/sdk-go/v2"
	ceevent "github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"

	"github.com/relaybus/relaybus/functions/publish"
	"github.com/relaybus/relaybus/internal/cloudevent"
	"github.com/relaybus/relaybus/shared/event"
)

// fullEvent has every field set, so a round trip shows nothing is lost.
func fullEvent(id, agg string, version int64) event.Event {
	return event.Event{
		ID: id, Type: "order.purchased", Source: "order-service", Topic: "shop.order.events",
		AggregateType: "order", AggregateID: agg, Version: version,
		OccurredAt:    time.Date(2026, 3, 4, 5, 6, 7, 8000, time.UTC),
		SchemaVersion: "v3", PayloadType: "application/json", Payload: []byte(`{"orderId":"` + agg + `","amount":99}`),
		TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", SpanID: "00f067aa0ba902b7", ParentEventID: "evt-parent",
		CorrelationID: "corr-9",
		Initiator:     event.Initiator{Service: "order-service", Operation: "createOrder", UserID: "user-7", ClientRequestID: "req-3"},
		ExpireAt:      time.Date(2026, 4, 4, 0, 0, 0, 0, time.UTC),
	}
}

// checkStored compares the outbox row of e.ID with e.
func checkStored(t *testing.T, h *harness, e event.Event) {
	t.Helper()
	r := h.row(t, e.ID)
	if r.aggType != e.AggregateType || r.aggID != e.AggregateID || r.typ != e.Type || r.version != e.Version ||
		r.topic != e.Topic || r.source != e.Source || r.schema != e.SchemaVersion || r.payloadType != e.PayloadType ||
		!bytes.Equal(r.payload, e.Payload) || !r.occurred.Equal(e.OccurredAt) || r.trace != e.TraceID ||
		r.span != e.SpanID || r.parent != e.ParentEventID || r.corr != e.CorrelationID ||
		r.initiator["service"] != e.Initiator.Service || r.initiator["operation"] != e.Initiator.Operation ||
		r.initiator["userId"] != e.Initiator.UserID || r.initiator["clientRequestId"] != e.Initiator.ClientRequestID ||
		(e.ExpireAt.IsZero() != (r.expire == nil)) || (r.expire != nil && !r.expire.Equal(e.ExpireAt)) {
		t.Fatalf("stored %+v (payload %s)\nsent   %+v (payload %s)", r, r.payload, e, e.Payload)
	}
}

func sendStatus(t *testing.T, res error) int {
	t.Helper()
	if !cloudevents.IsACK(res) {
		t.Fatalf("the SDK client got no ACK: %v", res)
	}
	var hr *cehttp.Result
	if !cloudevents.ResultAs(res, &hr) {
		t.Fatalf("not an HTTP result: %v", res)
	}
	return hr.StatusCode
}

func TestCloudEventsSDKClientBinaryAndStructured(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	c, err := cloudevents.NewClientHTTP(cloudevents.WithTarget(h.url))
	if err != nil {
		t.Fatal(err)
	}

	bin := fullEvent("ce-binary-1", "order-1", 1)
	if s := sendStatus(t, c.Send(ctx, cloudevent.FromEvent(&bin))); s != http.StatusAccepted {
		t.Fatalf("binary: status %d", s)
	}
	checkStored(t, h, bin)

	st := fullEvent("ce-structured-1", "order-2", 1)
	if s := sendStatus(t, c.Send(cloudevents.WithEncodingStructured(ctx), cloudevent.FromEvent(&st))); s != http.StatusAccepted {
		t.Fatalf("structured: status %d", s)
	}
	checkStored(t, h, st)

	// A payload that is not JSON: the body itself in binary mode,
	// data_base64 in structured mode.
	raw := fullEvent("ce-binary-raw", "order-3", 1)
	raw.PayloadType, raw.Payload = "application/octet-stream", []byte{0, 1, 2, 0xff}
	if s := sendStatus(t, c.Send(ctx, cloudevent.FromEvent(&raw))); s != http.StatusAccepted {
		t.Fatalf("binary raw: status %d", s)
	}
	checkStored(t, h, raw)
	raw2 := raw
	raw2.ID, raw2.AggregateID = "ce-structured-raw", "order-4"
	if s := sendStatus(t, c.Send(cloudevents.WithEncodingStructured(ctx), cloudevent.FromEvent(&raw2))); s != http.StatusAccepted {
		t.Fatalf("structured raw: status %d", s)
	}
	checkStored(t, h, raw2)

	// The SDK's own typed extensions: version as an integer.
	ce := cloudevents.NewEvent()
	ce.SetID("ce-typed-1")
	ce.SetType("order.purchased")
	ce.SetSource("order-service")
	ce.SetSubject("order-5")
	ce.SetExtension("topic", "shop.order.events")
	ce.SetExtension("version", 7)
	ce.SetExtension("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	if err := ce.SetData(cloudevents.ApplicationJSON, map[string]any{"orderId": "order-5"}); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []context.Context{ctx, cloudevents.WithEncodingStructured(ctx)} {
		if s := sendStatus(t, c.Send(mode, ce)); s != http.StatusAccepted {
			t.Fatalf("typed: status %d", s)
		}
	}
	r := h.row(t, "ce-typed-1")
	if r.version != 7 || r.aggType != "order" || r.trace != "0af7651916cd43dd8448eb211c80319c" || r.span != "b7ad6b7169203331" {
		t.Fatalf("typed: stored %+v: want version 7, aggregate type from the topic, trace from the traceparent extension", r)
	}
	if n := h.rows(t); n != 5 {
		t.Fatalf("%d rows, want 5 (the second send of ce-typed-1 is a duplicate)", n)
	}

	// The SDK's answer body, read through its request helpers.
	req, err := cehttp.NewHTTPRequestFromEvent(ctx, h.url, ce)
	if err != nil {
		t.Fatal(err)
	}
	status, body, _ := do(t, req)
	res := decodeJSON[publish.Result](t, body)
	if status != http.StatusAccepted || !res.Duplicate || res.EventID != "ce-typed-1" || res.Version != 7 {
		t.Fatalf("repeat: %d %+v", status, res)
	}
}

func TestCloudEventsSDKBatch(t *testing.T) {
	h := newHarness(t, nil)
	ctx := context.Background()
	events := []ceevent.Event{}
	var sent []event.Event
	for i, agg := range []string{"order-1", "order-1", "order-2"} {
		e := fullEvent("ce-batch-"+string(rune('a'+i)), agg, int64(i%2+1))
		if i == 2 {
			e.Version = 1
		}
		sent = append(sent, e)
		events = append(events, cloudevent.FromEvent(&e))
	}
	skipped := fullEvent("ce-batch-skip", "cart-1", 1)
	skipped.Topic, skipped.AggregateType = "shop.cart.events", "cart"
	events = append(events, cloudevent.FromEvent(&skipped))

	req, err := cehttp.NewHTTPRequestFromEvents(ctx, h.url, events)
	if err != nil {
		t.Fatal(err)
	}
	if ct := req.Header.Get("Content-Type"); ct != "application/cloudevents-batch+json" {
		t.Fatalf("the SDK sent %q", ct)
	}
	status, body, _ := do(t, req)
	if status != http.StatusAccepted {
		t.Fatalf("status %d: %s", status, body)
	}
	res := decodeJSON[publish.BatchResponse](t, body).Results
	if len(res) != 4 {
		t.Fatalf("results %s", body)
	}
	for i, e := range sent {
		if res[i].EventID != e.ID || res[i].Status != publish.StatusPending {
			t.Errorf("result %d: %+v", i, res[i])
		}
		checkStored(t, h, e)
	}
	if res[3].Status != publish.StatusSkipped || res[3].EventID != "ce-batch-skip" {
		t.Errorf("result 3: %+v, want SKIPPED", res[3])
	}
	if n := h.rows(t); n != 3 {
		t.Fatalf("%d rows, want 3", n)
	}
}

func TestCloudEventsStructuredProtobuf(t *testing.T) {
	h := newHarness(t, nil)
	e := fullEvent("ce-proto-1", "order-1", 1)
	ce := cloudevent.FromEvent(&e)
	b, err := pbformat.Protobuf.Marshal(&ce)
	if err != nil {
		t.Fatal(err)
	}
	status, body, _ := post(t, h.url, b, "Content-Type", "application/cloudevents+protobuf")
	if status != http.StatusAccepted {
		t.Fatalf("status %d: %s", status, body)
	}
	checkStored(t, h, e)
}
