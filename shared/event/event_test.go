package event

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

func sample() Event {
	return Event{
		ID:            "evt-0001",
		Type:          "order.purchased",
		Source:        "order-service",
		Topic:         "shop.order.events",
		AggregateType: "order",
		AggregateID:   "ORD-2024-002",
		Version:       3,
		OccurredAt:    time.Date(2024, 2, 28, 10, 5, 0, 123000000, time.UTC),
		SchemaVersion: "v1",
		PayloadType:   "application/json",
		Payload:       []byte(`{"orderId":"ORD-2024-002","userId":"user-A","amount":199}`),
		TraceID:       "4bf92f3577b34da6a3ce929d0e0e4736",
		SpanID:        "00f067aa0ba902b7",
		ParentEventID: "evt-0000",
		CorrelationID: "corr-1",
		SourceVersion: "1.4.2",
		Initiator:     Initiator{Service: "order-service", Operation: "confirmOrder", UserID: "user-A", ClientRequestID: "req-1"},
		ExpireAt:      time.Date(2024, 3, 28, 0, 0, 0, 0, time.UTC),
	}
}

func TestValidateNamesFieldAndRule(t *testing.T) {
	for _, tc := range []struct {
		field  string
		mutate func(*Event)
	}{
		{"eventId", func(e *Event) { e.ID = "" }},
		{"eventId", func(e *Event) { e.ID = "has space" }},
		{"sourceVersion", func(e *Event) { e.SourceVersion = "1.4 beta" }},
		{"eventId", func(e *Event) { e.ID = ".." }},
		{"eventType", func(e *Event) { e.Type = "" }},
		{"eventType", func(e *Event) { e.Type = "order..purchased" }},
		{"source", func(e *Event) { e.Source = ""; e.Initiator.Service = "" }},
		{"topic", func(e *Event) { e.Topic = "Shop_Orders" }},
		{"aggregateType", func(e *Event) { e.AggregateType = "Order" }},
		{"aggregateId", func(e *Event) { e.AggregateID = "" }},
		{"aggregateId", func(e *Event) { e.AggregateID = "ord/1" }},
		{"version", func(e *Event) { e.Version = 0 }},
		{"version", func(e *Event) { e.Version = -1 }},
		{"occurredAt", func(e *Event) { e.OccurredAt = time.Time{} }},
		{"schemaVersion", func(e *Event) { e.SchemaVersion = "1" }},
		{"payloadType", func(e *Event) { e.PayloadType = "not a type;;" }},
		{"payload", func(e *Event) { e.Payload = []byte(`{"broken":`) }},
		{"traceId", func(e *Event) { e.TraceID = "trace id" }},
		{"parentEventId", func(e *Event) { e.ParentEventID = strings.Repeat("p", 129) }},
		{"initiator.userId", func(e *Event) { e.Initiator.UserID = "bad\nline" }},
		{"expireAt", func(e *Event) { e.ExpireAt = e.OccurredAt.Add(-time.Second) }},
	} {
		e := sample()
		tc.mutate(&e)
		e.Normalize()
		err := e.Validate(Limits{})
		fes := FieldErrors(err)
		if len(fes) != 1 || fes[0].Field != tc.field || fes[0].Rule == "" {
			t.Errorf("%s: got %v, want exactly one error on %s", tc.field, err, tc.field)
			continue
		}
		if !errors.Is(err, ErrInvalid) || !strings.HasPrefix(err.Error(), tc.field+": ") {
			t.Errorf("%s: error %q", tc.field, err)
		}
	}
}

func TestValidateReportsEveryField(t *testing.T) {
	err := (&Event{}).Validate(Limits{})
	got := map[string]bool{}
	for _, fe := range FieldErrors(err) {
		got[fe.Field] = true
	}
	for _, f := range []string{"eventId", "eventType", "source", "topic", "aggregateType", "aggregateId", "version", "occurredAt", "schemaVersion", "payloadType"} {
		if !got[f] {
			t.Errorf("empty event: no error for %s (got %v)", f, err)
		}
	}
}

func TestPrepareFillsWhatCallersMayOmit(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	e := Event{Type: "order.purchased", Topic: "shop.order.events", AggregateID: " ORD-1 ", Version: 1,
		Payload: []byte(`{}`), Initiator: Initiator{Service: "order-service"}}
	if err := e.Prepare(now, Limits{}); err != nil {
		t.Fatal(err)
	}
	if e.ID == "" || len(e.TraceID) != 32 || !e.OccurredAt.Equal(now) || e.AggregateID != "ORD-1" ||
		e.AggregateType != "order" || e.Source != "order-service" || e.SchemaVersion != "v1" || e.PayloadType != "application/json" {
		t.Fatalf("Prepare left %+v", e)
	}
	id := e.ID
	if err := e.Prepare(now.Add(time.Hour), Limits{}); err != nil || e.ID != id || !e.OccurredAt.Equal(now) {
		t.Fatalf("Prepare is not idempotent: %+v %v", e, err)
	}
}

func TestEnvelopeJSONRoundTrip(t *testing.T) {
	in := sample()
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{`"eventId":"evt-0001"`, `"aggregateId":"ORD-2024-002"`, `"version":3`, `"payload":{"orderId"`, `"initiator":{"service":"order-service"`} {
		if !strings.Contains(string(b), f) {
			t.Errorf("envelope lacks %s: %s", f, b)
		}
	}
	var out Event
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	assertSameEvent(t, out, in)
}

func TestEnvelopeJSONErrorsNameTheField(t *testing.T) {
	for _, tc := range []struct{ body, field string }{
		{`{"version":"three"}`, "version"},
		{`{"occurredAt":"yesterday"}`, "occurredAt"},
		{`{"eventId":42}`, "eventId"},
		{`{"initiator":"me"}`, "initiator"},
		{`{"payloadType":"image/png","payload":{"a":1}}`, "payload"},
		{`{"expireAt":"soon"}`, "expireAt"},
	} {
		var e Event
		err := json.Unmarshal([]byte(tc.body), &e)
		fes := FieldErrors(err)
		if len(fes) == 0 || fes[0].Field != tc.field {
			t.Errorf("%s: got %v, want an error naming %s", tc.body, err, tc.field)
		}
	}
	var e Event
	if err := json.Unmarshal([]byte(`{"version":"7","causationId":"p1"}`), &e); err != nil || e.Version != 7 || e.ParentEventID != "p1" {
		t.Errorf("lenient forms refused: %v %+v", err, e)
	}
}

func assertSameEvent(t *testing.T, got, want Event) {
	t.Helper()
	if !got.OccurredAt.Equal(want.OccurredAt) || !got.ExpireAt.Equal(want.ExpireAt) {
		t.Errorf("times: got %v %v, want %v %v", got.OccurredAt, got.ExpireAt, want.OccurredAt, want.ExpireAt)
	}
	got.OccurredAt, want.OccurredAt = time.Time{}, time.Time{}
	got.ExpireAt, want.ExpireAt = time.Time{}, time.Time{}
	if IsJSONType(want.PayloadType) {
		var g, w any
		if json.Unmarshal(got.Payload, &g) != nil || json.Unmarshal(want.Payload, &w) != nil || !reflect.DeepEqual(g, w) {
			t.Errorf("payload: got %s, want %s", got.Payload, want.Payload)
		}
		got.Payload, want.Payload = nil, nil
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("event differs:\n got %+v\nwant %+v", got, want)
	}
}

func TestIsJSONType(t *testing.T) {
	for mt, want := range map[string]bool{
		"application/json": true, "application/json; charset=utf-8": true, "Application/JSON": true,
		" application/json ": true, "application/cloudevents+json": true, "text/json": true,
		"application/octet-stream": false, "application/x-protobuf": false, "": false, "json": false,
	} {
		if got := IsJSONType(mt); got != want {
			t.Errorf("IsJSONType(%q) = %v, want %v", mt, got, want)
		}
	}
}
