package forward_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/forward"
)

func ctxFor() *consumer.Context {
	e := &event.Event{ID: "evt-1", Type: "order.purchased", Source: "order-service", Topic: "shop.order.events",
		AggregateID: "order-1", Version: 3, Payload: []byte(`{"orderId":"order-1"}`), TraceID: "t-1"}
	_ = e.Prepare(time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC), event.Limits{})
	return &consumer.Context{Event: e, ConsumerID: "audit-service", Attempt: 2}
}

func TestStatusMappingAndHeaders(t *testing.T) {
	for _, c := range []struct {
		status int
		class  consumer.Class
		ok     bool
	}{
		{200, 0, true}, {204, 0, true},
		{400, consumer.ClassPermanent, false}, {404, consumer.ClassPermanent, false}, {422, consumer.ClassPermanent, false},
		{408, consumer.ClassTransient, false}, {429, consumer.ClassTransient, false},
		{500, consumer.ClassTransient, false}, {503, consumer.ClassTransient, false},
	} {
		var got *http.Request
		var body []byte
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			got = r
			body, _ = io.ReadAll(r.Body)
			w.WriteHeader(c.status)
		}))
		h, err := forward.New(forward.Options{URL: srv.URL, Header: http.Header{"Authorization": {"Bearer x"}}})
		if err != nil {
			t.Fatal(err)
		}
		err = h.Handle(context.Background(), ctxFor())
		srv.Close()
		if c.ok {
			if err != nil {
				t.Errorf("%d: %v, want success", c.status, err)
			}
		} else if class, code := consumer.Classify(err); err == nil || class != c.class || code == "" {
			t.Errorf("%d: %v (class %d), want class %d", c.status, err, class, c.class)
		}
		if got.Header.Get("Ce-Id") != "evt-1" || got.Header.Get("Ce-Type") != "order.purchased" || got.Header.Get("Ce-Subject") != "order-1" ||
			got.Header.Get("Ce-Version") != "3" || got.Header.Get("Authorization") != "Bearer x" ||
			got.Header.Get("X-Relaybus-Consumer") != "audit-service" || string(body) != `{"orderId":"order-1"}` {
			t.Errorf("%d: request headers %v body %s", c.status, got.Header, body)
		}
	}
}

func TestTimeoutAndUnreachableAreTransient(t *testing.T) {
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(2 * time.Second):
		}
	}))
	defer slow.Close()
	h, _ := forward.New(forward.Options{URL: slow.URL, Timeout: 50 * time.Millisecond})
	err := h.Handle(context.Background(), ctxFor())
	if class, _ := consumer.Classify(err); err == nil || class != consumer.ClassTransient {
		t.Errorf("timeout: %v", err)
	}
	h, _ = forward.New(forward.Options{URL: "http://127.0.0.1:1/"})
	err = h.Handle(context.Background(), ctxFor())
	if class, code := consumer.Classify(err); err == nil || class != consumer.ClassTransient || code != "forward_unreachable" {
		t.Errorf("unreachable: %v", err)
	}
	if _, err := forward.New(forward.Options{}); err == nil {
		t.Error("a forwarder without a URL was built")
	}
}
