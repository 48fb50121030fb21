package cloudevent

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/relaybus/relaybus/shared/event"
)

func sample() event.Event {
	return event.Event{
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
		SourceVersion: "order-service-00042-kiq",
		Initiator:     event.Initiator{Service: "order-service", Operation: "confirmOrder", UserID: "user-A", ClientRequestID: "req-1"},
		ExpireAt:      time.Date(2024, 3, 28, 0, 0, 0, 0, time.UTC),
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	for _, enc := range []event.Encoding{event.EncodingJSON, event.EncodingProtobuf} {
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
				event.AttrEventID: "evt-0001", event.AttrEventType: "order.purchased", event.AttrAggregateID: "ORD-2024-002",
				event.AttrAggregateType: "order", event.AttrVersion: "3", event.AttrOccurredAt: "2024-02-28T10:05:00.123Z",
				event.AttrSchemaVersion: "v1", event.AttrTraceID: in.TraceID, event.AttrSpanID: in.SpanID,
				event.AttrCorrelationID: "corr-1", event.AttrCausationID: "evt-0000", event.AttrUserID: "user-A",
				event.AttrSourceService: "order-service", event.AttrExpireAt: "2024-03-28T00:00:00Z",
				event.AttrSourceVersion: "order-service-00042-kiq",
			}
			for k, v := range wantAttrs {
				if msg.Attributes[k] != v {
					t.Errorf("attribute %s = %q, want %q", k, msg.Attributes[k], v)
				}
			}
			out, info, err := Decode(msg, event.Limits{})
			if err != nil {
				t.Fatal(err)
			}
			if info.AggregateIDFrom != event.FromEnvelope {
				t.Errorf("aggregate id from %s, want envelope", info.AggregateIDFrom)
			}
			assertSameEvent(t, out, in)
		})
	}
}

func TestStructuredJSONIsACloudEvent(t *testing.T) {
	in := sample()
	msg, err := Encode(&in, event.EncodingJSON)
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
	if msg.Attributes[event.AttrContentType] != event.MediaTypeCloudEventsJSON {
		t.Errorf("content-type %q", msg.Attributes[event.AttrContentType])
	}
}

func TestBinaryPayloadTravelsAsBase64(t *testing.T) {
	in := sample()
	in.PayloadType = "application/x-protobuf"
	in.Payload = []byte{0x0a, 0x03, 'O', 'R', 'D', 0xff, 0x00}
	for _, enc := range []event.Encoding{event.EncodingJSON, event.EncodingProtobuf} {
		msg, err := Encode(&in, enc)
		if err != nil {
			t.Fatal(err)
		}
		out, _, err := Decode(msg, event.Limits{})
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
	msg := event.Message{
		Data: in.Payload,
		Attributes: map[string]string{
			"ce-specversion": "1.0", "ce-id": in.ID, "ce-type": in.Type, "ce-source": in.Source,
			"ce-subject": in.AggregateID, "ce-time": "2024-02-28T10:05:00.123Z", "content-type": "application/json",
			"ce-topic": in.Topic, "ce-aggregatetype": "order", "ce-version": "3", "ce-schemaversion": "v1",
			"ce-traceid": in.TraceID, "ce-spanid": in.SpanID, "ce-causationid": "evt-0000", "ce-correlationid": "corr-1",
			"ce-initiatorservice": "order-service", "ce-initiatoroperation": "confirmOrder", "ce-initiatoruserid": "user-A",
			"ce-initiatorrequestid": "req-1", "ce-expireat": "2024-03-28T00:00:00Z", "ce-sourceversion": "order-service-00042-kiq",
		},
	}
	out, info, err := Decode(msg, event.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode != event.ModeBinary {
		t.Errorf("mode %s", info.Mode)
	}
	assertSameEvent(t, out, in)
}

func TestDecodeLegacyAttributesOnly(t *testing.T) {
	in := sample()
	in.ExpireAt = time.Time{}
	in.Initiator = event.Initiator{UserID: "user-A"}
	attrs := event.Attributes(&in, "")
	msg := event.Message{Data: in.Payload, Attributes: attrs, OrderingKey: in.AggregateID, Topic: in.Topic}
	out, info, err := Decode(msg, event.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode != event.ModeLegacy || info.AggregateIDFrom != event.FromAttribute {
		t.Errorf("decoded as %+v", info)
	}
	assertSameEvent(t, out, in)
}

func TestDecodeLegacyProtobufPayloadWithoutContentType(t *testing.T) {
	msg := event.Message{
		Data:        []byte{0x08, 0x96, 0x01},
		Attributes:  map[string]string{event.AttrEventID: "e1", event.AttrEventType: "video.created", event.AttrVersion: "1", event.AttrAggregateID: "v1"},
		PublishTime: time.Date(2025, 10, 24, 10, 30, 1, 0, time.UTC),
		Topic:       "catalog.video.events",
	}
	out, _, err := Decode(msg, event.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if out.PayloadType != "application/octet-stream" || out.Source != event.UnknownSource || out.AggregateType != "video" || !out.OccurredAt.Equal(msg.PublishTime) {
		t.Errorf("legacy defaults not applied: %+v", out)
	}
}

func TestAggregateIDPrecedence(t *testing.T) {
	for _, tc := range []struct {
		name                    string
		envelope, attr, key     string
		wantID, wantFrom, wantR string
	}{
		{"envelope wins", "env-1", "attr-1", "key-1", "env-1", event.FromEnvelope, ""},
		{"attribute second", "", "attr-1", "key-1", "attr-1", event.FromAttribute, ""},
		{"ordering key last", "", "", "key-1", "key-1", event.FromOrderingKey, ""},
		{"trimmed", "  env-1 \t", "", "", "env-1", event.FromEnvelope, ""},
		{"blank envelope skipped", "   ", "attr-1", "", "attr-1", event.FromAttribute, ""},
		{"none", "", "", "", "", "", event.ReasonMissingAggregateID},
		{"invalid envelope is not skipped", "bad id", "attr-1", "key-1", "", "", event.ReasonInvalidAggregateID},
		{"invalid chars", "", "a/b", "", "", "", event.ReasonInvalidAggregateID},
		{"too long", strings.Repeat("x", 257), "", "", "", "", event.ReasonInvalidAggregateID},
		{"max length", strings.Repeat("x", 256), "", "", strings.Repeat("x", 256), event.FromEnvelope, ""},
		{"allowed punctuation", "tenant:ORD_1-2", "", "", "tenant:ORD_1-2", event.FromEnvelope, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := sample()
			in.AggregateID = tc.envelope
			msg, err := Encode(&in, event.EncodingJSON)
			if err != nil {
				t.Fatal(err)
			}
			delete(msg.Attributes, event.AttrAggregateID)
			if tc.attr != "" {
				msg.Attributes[event.AttrAggregateID] = tc.attr
			}
			msg.OrderingKey = tc.key
			out, info, err := Decode(msg, event.Limits{})
			if tc.wantR != "" {
				var de *event.DecodeError
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

func TestPayloadLimit(t *testing.T) {
	e := sample()
	e.PayloadType = "application/octet-stream"
	e.Payload = make([]byte, 2048)
	if err := e.Validate(event.Limits{MaxPayloadBytes: 2048}); err != nil {
		t.Fatalf("payload at the limit refused: %v", err)
	}
	err := e.Validate(event.Limits{MaxPayloadBytes: 2047})
	if !errors.Is(err, event.ErrTooLarge) || !strings.Contains(err.Error(), "payload: at most 2047 bytes (got 2048)") {
		t.Fatalf("got %v", err)
	}
	if got := (event.Limits{MaxPayloadBytes: 50_000_000}).PayloadLimit(); got != event.MaxPayloadLimit {
		t.Errorf("limit above Pub/Sub's is not capped: %d", got)
	}
	if got := (event.Limits{}).PayloadLimit(); got != event.DefaultPayloadLimit {
		t.Errorf("default limit %d", got)
	}
	// Whatever Validate accepts fits in a Pub/Sub message, in both encodings.
	big := event.Limits{MaxPayloadBytes: event.MaxPayloadLimit}
	e.Payload = make([]byte, event.MaxBinaryPayload)
	if err := e.Validate(big); err != nil {
		t.Fatalf("largest binary payload refused: %v", err)
	}
	for _, enc := range []event.Encoding{event.EncodingJSON, event.EncodingProtobuf} {
		if _, err := Encode(&e, enc); err != nil {
			t.Errorf("largest binary payload does not encode as %s: %v", enc, err)
		}
	}
	e.Payload = make([]byte, event.MaxBinaryPayload+4)
	if err := e.Validate(big); !errors.Is(err, event.ErrTooLarge) || !strings.Contains(err.Error(), "base64") {
		t.Errorf("binary payload over the base64 limit: %v", err)
	}
	e.PayloadType = "application/json"
	e.Payload = []byte(`"` + strings.Repeat("a", event.MaxPayloadLimit-2) + `"`)
	if err := e.Validate(big); err != nil {
		t.Fatalf("largest JSON payload refused: %v", err)
	}
	if _, err := Encode(&e, event.EncodingJSON); err != nil {
		t.Errorf("largest JSON payload does not encode: %v", err)
	}
}

func TestDecodeMalformedIsPoison(t *testing.T) {
	for _, msg := range []event.Message{
		{Data: []byte("{not json"), Attributes: map[string]string{event.AttrContentType: event.MediaTypeCloudEventsJSON}},
		{Data: []byte{0xff, 0xfe}, Attributes: map[string]string{event.AttrContentType: event.MediaTypeCloudEventsProtobuf}},
		{Data: []byte(`{}`), Attributes: map[string]string{"ce-specversion": "0.3", "ce-id": "x"}},
		{Data: []byte(`{}`), Attributes: map[string]string{"ce-id": "x", "ce-time": "noon"}},
	} {
		_, _, err := Decode(msg, event.Limits{})
		var de *event.DecodeError
		if !errors.As(err, &de) || de.Reason != event.ReasonMalformed {
			t.Errorf("%q: got %v, want malformed", msg.Data, err)
		}
	}
}

func assertSameEvent(t *testing.T, got, want event.Event) {
	t.Helper()
	if !got.OccurredAt.Equal(want.OccurredAt) || !got.ExpireAt.Equal(want.ExpireAt) {
		t.Errorf("times: got %v %v, want %v %v", got.OccurredAt, got.ExpireAt, want.OccurredAt, want.ExpireAt)
	}
	got.OccurredAt, want.OccurredAt = time.Time{}, time.Time{}
	got.ExpireAt, want.ExpireAt = time.Time{}, time.Time{}
	if event.IsJSONType(want.PayloadType) {
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

// The leaf's CloudEventAttributes (what the Go client writes by hand, with
// no SDK) is the SDK event's attributes exactly: one mapping, two writers.
func TestCloudEventAttributesAreTheSDKEventsAttributes(t *testing.T) {
	for name, e := range map[string]event.Event{"full": sample(), "minimal": {ID: "e-1", Type: "order.purchased", Source: "s"}} {
		ce := FromEvent(&e)
		want := map[string]string{"specversion": ce.SpecVersion(), "id": ce.ID(), "type": ce.Type(), "source": ce.Source()}
		if s := ce.Subject(); s != "" {
			want["subject"] = s
		}
		if !ce.Time().IsZero() {
			want["time"] = ce.Time().UTC().Format(time.RFC3339Nano)
		}
		if ct := ce.DataContentType(); ct != "" {
			want["datacontenttype"] = ct
		}
		for k, v := range ce.Extensions() {
			s, ok := v.(string)
			if !ok {
				t.Fatalf("%s: extension %s is a %T", name, k, v)
			}
			want[k] = s
		}
		if got := e.CloudEventAttributes(); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: CloudEventAttributes\n got %v\nwant %v (the SDK's)", name, got, want)
		}
	}
}
