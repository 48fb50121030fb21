package delivery

import (
	"bytes"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/relaybus/relaybus/shared/event"
)

func sampleMessage(t *testing.T) event.Message {
	t.Helper()
	e := event.Event{ID: "evt-1", Type: "order.purchased", Source: "order-service", Topic: "shop.order.events",
		AggregateID: "ORD-1", Version: 2, OccurredAt: time.Date(2024, 2, 28, 10, 5, 0, 0, time.UTC), Payload: []byte(`{"a":1}`)}
	e.Normalize()
	m, err := event.Encode(&e, event.EncodingJSON)
	if err != nil {
		t.Fatal(err)
	}
	m.ID = "1234567890"
	m.PublishTime = time.Date(2024, 2, 28, 10, 5, 1, 123000000, time.UTC)
	return m
}

const sub = "projects/p/subscriptions/shop.order.events.member-service-processor"

func TestEveryShapeYieldsTheSameMessage(t *testing.T) {
	m := sampleMessage(t)
	wrapped := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(WrappedBody(m, sub, 3)))
	wrapped.Header.Set("Content-Type", "application/json")
	eventarc, _ := EventarcRequest("http://x/", "p", "shop.order.events", sub, m)
	unwrapped, _ := UnwrappedRequest("http://x/", sub, m, 3)

	for _, tc := range []struct {
		name        string
		req         *http.Request
		mode        string
		attempt     int
		topicInline string
	}{
		{"push wrapped", wrapped, ModePush, 3, "shop.order.events"},
		{"eventarc binary", eventarc, ModeEventarc, 0, "shop.order.events"},
		{"push unwrapped", unwrapped, ModePushUnwrapped, 3, "shop.order.events"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := Read(tc.req, 0)
			if err != nil {
				t.Fatal(err)
			}
			if d.Mode != tc.mode || d.Subscription != sub || d.Message.DeliveryAttempt != tc.attempt || d.Message.Topic != tc.topicInline {
				t.Errorf("got mode=%s sub=%s attempt=%d topic=%q", d.Mode, d.Subscription, d.Message.DeliveryAttempt, d.Message.Topic)
			}
			if d.Topic() != "shop.order.events" {
				t.Errorf("Topic() = %q", d.Topic())
			}
			got := d.Message
			if got.ID != m.ID || got.OrderingKey != m.OrderingKey || !got.PublishTime.Equal(m.PublishTime) || !bytes.Equal(got.Data, m.Data) || !reflect.DeepEqual(got.Attributes, m.Attributes) {
				t.Errorf("message differs:\n got %+v\nwant %+v", got, m)
			}
			e, _, err := event.Decode(got, event.Limits{})
			if err != nil || e.ID != "evt-1" || e.AggregateID != "ORD-1" || e.Version != 2 {
				t.Errorf("decoded %+v, %v", e, err)
			}
		})
	}
}

// A push body as Pub/Sub documents it, written by hand rather than by our
// own builder.
func TestDocumentedPushBody(t *testing.T) {
	body := `{
	  "message": {
	    "attributes": {"event_id": "e1", "event_type": "video.created", "version": "1"},
	    "data": "eyJ0aXRsZSI6IngifQ==",
	    "messageId": "2070443601311540", "message_id": "2070443601311540",
	    "orderingKey": "v-1",
	    "publishTime": "2021-02-26T19:13:55.749Z", "publish_time": "2021-02-26T19:13:55.749Z"
	  },
	  "subscription": "projects/myproject/subscriptions/catalog.video.events.search-indexer",
	  "deliveryAttempt": 5
	}`
	d, err := Read(httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body)), 0)
	if err != nil {
		t.Fatal(err)
	}
	if d.Message.OrderingKey != "v-1" || d.Message.DeliveryAttempt != 5 || string(d.Message.Data) != `{"title":"x"}` || d.Topic() != "catalog.video.events" {
		t.Fatalf("%+v", d)
	}
	e, info, err := event.Decode(d.Message, event.Limits{})
	if err != nil || info.Mode != event.ModeLegacy || info.AggregateIDFrom != event.FromOrderingKey || e.AggregateID != "v-1" {
		t.Fatalf("%+v %+v %v", e, info, err)
	}
}

func TestStructuredEventarc(t *testing.T) {
	m := sampleMessage(t)
	inner := string(WrappedBody(m, sub, 0))
	body := `{"specversion":"1.0","id":"x","type":"` + MessagePublishedType + `","source":"//pubsub.googleapis.com/projects/p/topics/shop.order.events","datacontenttype":"application/json","data":` + inner + `}`
	req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/cloudevents+json; charset=utf-8")
	d, err := Read(req, 0)
	if err != nil || d.Mode != ModeEventarc || d.Message.Topic != "shop.order.events" || d.Message.OrderingKey != "ORD-1" {
		t.Fatalf("%+v %v", d, err)
	}
}

func TestUnwrappedBinaryModeCloudEvent(t *testing.T) {
	req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`{"a":1}`))
	for k, v := range map[string]string{"Ce-Specversion": "1.0", "Ce-Id": "evt-9", "Ce-Type": "order.purchased", "Ce-Source": "order-service",
		"Ce-Subject": "ORD-9", "Ce-Version": "4", "Ce-Topic": "shop.order.events", "Content-Type": "application/json",
		"X-Goog-Pubsub-Ordering-Key": "ORD-9", "X-Goog-Pubsub-Publish-Time": "2024-02-28T10:05:01Z", "User-Agent": "APIs-Google"} {
		req.Header.Set(k, v)
	}
	d, err := Read(req, 0)
	if err != nil || d.Mode != ModePushUnwrapped || d.Message.OrderingKey != "ORD-9" {
		t.Fatalf("%+v %v", d, err)
	}
	if _, ok := d.Message.Attributes["user-agent"]; ok {
		t.Error("HTTP header taken for an attribute")
	}
	e, info, err := event.Decode(d.Message, event.Limits{})
	if err != nil || info.Mode != event.ModeBinary || e.ID != "evt-9" || e.Version != 4 {
		t.Fatalf("%+v %+v %v", e, info, err)
	}
}

func TestMalformed(t *testing.T) {
	for name, req := range map[string]*http.Request{
		"eventarc without message": func() *http.Request {
			r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`{"subscription":"s"}`))
			r.Header.Set("Ce-Type", MessagePublishedType)
			return r
		}(),
		"eventarc not json": func() *http.Request {
			r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`garbage`))
			r.Header.Set("Ce-Type", MessagePublishedType)
			return r
		}(),
		"bad base64": httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`{"message":{"data":"!!!"}}`)),
		"bad time":   httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`{"message":{"data":"eA==","publishTime":"noon"}}`)),
		"empty":      httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`{"message":{}}`)),
	} {
		if _, err := Read(req, 0); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: got %v", name, err)
		}
	}
	big := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(make([]byte, 2048)))
	if _, err := Read(big, 1024); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "1024") {
		t.Errorf("oversized body: %v", err)
	}
}

// FuzzRead: any body and headers either decode or fail with ErrMalformed;
// nothing panics.
func FuzzRead(f *testing.F) {
	f.Add([]byte(`{"message":{"data":"eA==","attributes":{"a":"b"},"orderingKey":"k"},"subscription":"s","deliveryAttempt":2}`), "", "application/json")
	f.Add([]byte(`{"message":{"data":"eA=="},"subscription":"s"}`), MessagePublishedType, "application/json")
	f.Add([]byte(`{"type":"`+MessagePublishedType+`","data":{"message":{"data":"eA=="}}}`), "", "application/cloudevents+json")
	f.Add([]byte(`raw bytes`), "", "application/octet-stream")
	f.Fuzz(func(t *testing.T, body []byte, ceType, contentType string) {
		req := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
		if ceType != "" {
			req.Header.Set("Ce-Type", ceType)
		}
		req.Header.Set("Content-Type", contentType)
		d, err := Read(req, 1<<16)
		if ceType != MessagePublishedType && !strings.HasPrefix(strings.ToLower(contentType), event.MediaTypeCloudEventsJSON) && len(body) <= 1<<16 {
			// A push body: decoded once, it reads as the two-pass decoding
			// (is it a wrapper? then decode it) read it.
			want, werr := twoPassPush(body, req.Header)
			if (err == nil) != (werr == nil) || (err != nil && err.Error() != werr.Error()) {
				t.Fatalf("error %v, the two-pass decoding's %v", err, werr)
			}
			if err == nil && want.Message.Topic == "" {
				want.Message.Topic = want.Topic()
			}
			if err == nil && !reflect.DeepEqual(d, want) {
				t.Fatalf("read %+v, the two-pass decoding read %+v", d, want)
			}
		}
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error not ErrMalformed: %v", err)
			}
			return
		}
		if d.Message.Attributes == nil {
			t.Fatal("nil attributes")
		}
		_, _, _ = event.Decode(d.Message, event.Limits{})
	})
}

// twoPassPush is how a push body was read before it was decoded once: is
// it a wrapper (an object whose message is an object)? then decode it as
// one, else it is an unwrapped message.
func twoPassPush(body []byte, h http.Header) (Delivery, error) {
	if looksWrapped(body) {
		return fromWrapper(body, ModePush)
	}
	return unwrapped(body, h), nil
}

// The push bodies at the edges of the one-pass decoding read as the
// two-pass decoding read them.
func TestPushDecodedOnceAsBefore(t *testing.T) {
	for _, body := range []string{
		`{"message":{"data":"eA==","attributes":{"a":"b"},"orderingKey":"k","publishTime":"2026-01-02T03:04:05.123Z"},"subscription":"s","deliveryAttempt":2}`,
		`{"message":null}`,
		`{"message":"a string"}`,
		`{"message":{}}`,
		`{"message":{"data":"!!!"}}`,
		`{"message":{"data":"eA=="},"deliveryAttempt":"two"}`,
		`{"orderId":"o-1","message":"hello"}`,
		`{"orderId":"o-1"}`,
		`  {"message":{"data":"eA=="}}  `,
		`{"message":{"data":"eA=="}} trailing`,
		`[{"message":{"data":"eA=="}}]`,
		`not json`,
		``,
	} {
		req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		got, err := Read(req, 0)
		want, werr := twoPassPush([]byte(body), req.Header)
		if err == nil && want.Message.Topic == "" {
			want.Message.Topic = want.Topic()
		}
		if (err == nil) != (werr == nil) || (err != nil && err.Error() != werr.Error()) || (err == nil && !reflect.DeepEqual(got, want)) {
			t.Errorf("%s: read %+v, %v; the two-pass decoding read %+v, %v", body, got, err, want, werr)
		}
	}
}

// The body is read whole whatever its Content-Length says: exact, absent,
// or shorter than the body (a client's mistake the server may not catch),
// and the limit holds either way.
func TestBodyReadWhateverItsLength(t *testing.T) {
	body := string(WrappedBody(sampleMessage(t), sub, 1))
	for name, cl := range map[string]int64{"exact": int64(len(body)), "unknown": -1, "short": int64(len(body) - 10)} {
		req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body))
		req.ContentLength = cl
		got, err := readBody(req, 1<<20)
		if err != nil || string(got) != body {
			t.Errorf("%s: read %d bytes, %v; want the %d-byte body", name, len(got), err, len(body))
		}
		req = httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body))
		req.ContentLength = cl
		if _, err := Read(req, int64(len(body)-1)); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: a body over the limit: %v, want ErrMalformed", name, err)
		}
	}
}
