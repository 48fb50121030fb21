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
		Initiator:     Initiator{Service: "order-service", Operation: "confirmOrder", UserID: "user-A", ClientRequestID: "req-1"},
		ExpireAt:      time.Date(2024, 3, 28, 0, 0, 0, 0, time.UTC),
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	for _, enc := range []Encoding{EncodingJSON, EncodingProtobuf} {
		t.Run(string(enc), func(t *testing.T) {
			in := sample()
			msg, err := Encode(&in, enc)
			if err != nil {
				t.Fatal(err)
			}
			if msg.OrderingKey != in.AggregateID {
				t.Errorf("ordering key %q, want the aggregate id %q", msg.OrderingKey, in.AggregateID)
			}
			wantAttrs := map[string]string{
				AttrEventID: "evt-0001", AttrEventType: "order.purchased", AttrAggregateID: "ORD-2024-002",
				AttrAggregateType: "order", AttrVersion: "3", AttrOccurredAt: "2024-02-28T10:05:00.123Z",
				AttrSchemaVersion: "v1", AttrTraceID: in.TraceID, AttrSpanID: in.SpanID,
				AttrCorrelationID: "corr-1", AttrCausationID: "evt-0000", AttrUserID: "user-A",
				AttrSourceService: "order-service", AttrExpireAt: "2024-03-28T00:00:00Z",
			}
			for k, v := range wantAttrs {
				if msg.Attributes[k] != v {
					t.Errorf("attribute %s = %q, want %q", k, msg.Attributes[k], v)
				}
			}
			out, info, err := Decode(msg, Limits{})
			if err != nil {
				t.Fatal(err)
			}
			if info.AggregateIDFrom != FromEnvelope {
				t.Errorf("aggregate id from %s, want envelope", info.AggregateIDFrom)
			}
			assertSameEvent(t, out, in)
		})
	}
}

func TestStructuredJSONIsACloudEvent(t *testing.T) {
	in := sample()
	msg, err := Encode(&in, EncodingJSON)
	if err != nil {
		t.Fatal(err)
	}
	var ce map[string]any
	if err := json.Unmarshal(msg.Data, &ce); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]any{
		"specversion": "1.0", "id": "evt-0001", "type": "order.purchased", "source": "order-service",
		"subject": "ORD-2024-002", "datacontenttype": "application/json", "topic": "shop.order.events",
		"aggregatetype": "order", "version": "3", "schemaversion": "v1", "causationid": "evt-0000",
		"initiatorservice": "order-service", "initiatoruserid": "user-A",
	} {
		if ce[k] != v {
			t.Errorf("CloudEvent %s = %v, want %v", k, ce[k], v)
		}
	}
	if data, ok := ce["data"].(map[string]any); !ok || data["orderId"] != "ORD-2024-002" {
		t.Errorf("JSON payload not inlined as data: %v", ce["data"])
	}
	if msg.Attributes[AttrContentType] != MediaTypeCloudEventsJSON {
		t.Errorf("content-type %q", msg.Attributes[AttrContentType])
	}
}

func TestBinaryPayloadTravelsAsBase64(t *testing.T) {
	in := sample()
	in.PayloadType = "application/x-protobuf"
	in.Payload = []byte{0x0a, 0x03, 'O', 'R', 'D', 0xff, 0x00}
	for _, enc := range []Encoding{EncodingJSON, EncodingProtobuf} {
		msg, err := Encode(&in, enc)
		if err != nil {
			t.Fatal(err)
		}
		out, _, err := Decode(msg, Limits{})
		if err != nil {
			t.Fatalf("%s: %v", enc, err)
		}
		if string(out.Payload) != string(in.Payload) || out.PayloadType != in.PayloadType {
			t.Errorf("%s: payload %x %q, want %x %q", enc, out.Payload, out.PayloadType, in.Payload, in.PayloadType)
		}
	}
}

func TestDecodeBinaryMode(t *testing.T) {
	in := sample()
	msg := Message{
		Data: in.Payload,
		Attributes: map[string]string{
			"ce-specversion": "1.0", "ce-id": in.ID, "ce-type": in.Type, "ce-source": in.Source,
			"ce-subject": in.AggregateID, "ce-time": "2024-02-28T10:05:00.123Z", "content-type": "application/json",
			"ce-topic": in.Topic, "ce-aggregatetype": "order", "ce-version": "3", "ce-schemaversion": "v1",
			"ce-traceid": in.TraceID, "ce-spanid": in.SpanID, "ce-causationid": "evt-0000", "ce-correlationid": "corr-1",
			"ce-initiatorservice": "order-service", "ce-initiatoroperation": "confirmOrder", "ce-initiatoruserid": "user-A",
			"ce-initiatorrequestid": "req-1", "ce-expireat": "2024-03-28T00:00:00Z",
		},
	}
	out, info, err := Decode(msg, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode != ModeBinary {
		t.Errorf("mode %s", info.Mode)
	}
	assertSameEvent(t, out, in)
}

func TestDecodeLegacyAttributesOnly(t *testing.T) {
	in := sample()
	in.ExpireAt = time.Time{}
	in.Initiator = Initiator{UserID: "user-A"}
	attrs := Attributes(&in, "")
	msg := Message{Data: in.Payload, Attributes: attrs, OrderingKey: in.AggregateID, Topic: in.Topic}
	out, info, err := Decode(msg, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode != ModeLegacy || info.AggregateIDFrom != FromAttribute {
		t.Errorf("decoded as %+v", info)
	}
	assertSameEvent(t, out, in)
}

func TestDecodeLegacyProtobufPayloadWithoutContentType(t *testing.T) {
	msg := Message{
		Data:        []byte{0x08, 0x96, 0x01},
		Attributes:  map[string]string{AttrEventID: "e1", AttrEventType: "video.created", AttrVersion: "1", AttrAggregateID: "v1"},
		PublishTime: time.Date(2025, 10, 24, 10, 30, 1, 0, time.UTC),
		Topic:       "catalog.video.events",
	}
	out, _, err := Decode(msg, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if out.PayloadType != "application/octet-stream" || out.Source != UnknownSource || out.AggregateType != "video" || !out.OccurredAt.Equal(msg.PublishTime) {
		t.Errorf("legacy defaults not applied: %+v", out)
	}
}

func TestAggregateIDPrecedence(t *testing.T) {
	for _, tc := range []struct {
		name                    string
		envelope, attr, key     string
		wantID, wantFrom, wantR string
	}{
		{"envelope wins", "env-1", "attr-1", "key-1", "env-1", FromEnvelope, ""},
		{"attribute second", "", "attr-1", "key-1", "attr-1", FromAttribute, ""},
		{"ordering key last", "", "", "key-1", "key-1", FromOrderingKey, ""},
		{"trimmed", "  env-1 \t", "", "", "env-1", FromEnvelope, ""},
		{"blank envelope skipped", "   ", "attr-1", "", "attr-1", FromAttribute, ""},
		{"none", "", "", "", "", "", ReasonMissingAggregateID},
		{"invalid envelope is not skipped", "bad id", "attr-1", "key-1", "", "", ReasonInvalidAggregateID},
		{"invalid chars", "", "a/b", "", "", "", ReasonInvalidAggregateID},
		{"too long", strings.Repeat("x", 257), "", "", "", "", ReasonInvalidAggregateID},
		{"max length", strings.Repeat("x", 256), "", "", strings.Repeat("x", 256), FromEnvelope, ""},
		{"allowed punctuation", "tenant:ORD_1-2", "", "", "tenant:ORD_1-2", FromEnvelope, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := sample()
			in.AggregateID = tc.envelope
			msg, err := Encode(&in, EncodingJSON)
			if err != nil {
				t.Fatal(err)
			}
			delete(msg.Attributes, AttrAggregateID)
			if tc.attr != "" {
				msg.Attributes[AttrAggregateID] = tc.attr
			}
			msg.OrderingKey = tc.key
			out, info, err := Decode(msg, Limits{})
			if tc.wantR != "" {
				var de *DecodeError
				if !errors.As(err, &de) || de.Reason != tc.wantR {
					t.Fatalf("err = %v, want reason %s", err, tc.wantR)
				}
				if !strings.Contains(err.Error(), "aggregate") {
					t.Errorf("error %q does not name the aggregate id", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if out.AggregateID != tc.wantID || info.AggregateIDFrom != tc.wantFrom {
				t.Errorf("got %q from %s, want %q from %s", out.AggregateID, info.AggregateIDFrom, tc.wantID, tc.wantFrom)
			}
		})
	}
}

func TestValidateNamesFieldAndRule(t *testing.T) {
	for _, tc := range []struct {
		field  string
		mutate func(*Event)
	}{
		{"eventId", func(e *Event) { e.ID = "" }},
		{"eventId", func(e *Event) { e.ID = "has space" }},
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

func TestPayloadLimit(t *testing.T) {
	e := sample()
	e.PayloadType = "application/octet-stream"
	e.Payload = make([]byte, 2048)
	if err := e.Validate(Limits{MaxPayloadBytes: 2048}); err != nil {
		t.Fatalf("payload at the limit refused: %v", err)
	}
	err := e.Validate(Limits{MaxPayloadBytes: 2047})
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "payload: at most 2047 bytes (got 2048)") {
		t.Fatalf("got %v", err)
	}
	if got := (Limits{MaxPayloadBytes: 50_000_000}).PayloadLimit(); got != MaxPayloadLimit {
		t.Errorf("limit above Pub/Sub's is not capped: %d", got)
	}
	if got := (Limits{}).PayloadLimit(); got != DefaultPayloadLimit {
		t.Errorf("default limit %d", got)
	}
	// Whatever Validate accepts fits in a Pub/Sub message, in both encodings.
	big := Limits{MaxPayloadBytes: MaxPayloadLimit}
	e.Payload = make([]byte, MaxBinaryPayload)
	if err := e.Validate(big); err != nil {
		t.Fatalf("largest binary payload refused: %v", err)
	}
	for _, enc := range []Encoding{EncodingJSON, EncodingProtobuf} {
		if _, err := Encode(&e, enc); err != nil {
			t.Errorf("largest binary payload does not encode as %s: %v", enc, err)
		}
	}
	e.Payload = make([]byte, MaxBinaryPayload+4)
	if err := e.Validate(big); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "base64") {
		t.Errorf("binary payload over the base64 limit: %v", err)
	}
	e.PayloadType = "application/json"
	e.Payload = []byte(`"` + strings.Repeat("a", MaxPayloadLimit-2) + `"`)
	if err := e.Validate(big); err != nil {
		t.Fatalf("largest JSON payload refused: %v", err)
	}
	if _, err := Encode(&e, EncodingJSON); err != nil {
		t.Errorf("largest JSON payload does not encode: %v", err)
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

func TestDecodeMalformedIsPoison(t *testing.T) {
	for _, msg := range []Message{
		{Data: []byte("{not json"), Attributes: map[string]string{AttrContentType: MediaTypeCloudEventsJSON}},
		{Data: []byte{0xff, 0xfe}, Attributes: map[string]string{AttrContentType: MediaTypeCloudEventsProtobuf}},
		{Data: []byte(`{}`), Attributes: map[string]string{"ce-specversion": "0.3", "ce-id": "x"}},
		{Data: []byte(`{}`), Attributes: map[string]string{"ce-id": "x", "ce-time": "noon"}},
	} {
		_, _, err := Decode(msg, Limits{})
		var de *DecodeError
		if !errors.As(err, &de) || de.Reason != ReasonMalformed {
			t.Errorf("%q: got %v, want malformed", msg.Data, err)
		}
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
