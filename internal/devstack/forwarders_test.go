package devstack

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/emulator"
	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/shared/event"
)

// A forwarder added through the local stack's operations API receives
// the next events published through publish, in order (the delivery loop
// pushing its new subscription to the forwarders service), and nothing
// once it is removed (its route stopped, its subscription deleted).
func TestAForwarderOnTheLocalStack(t *testing.T) {
	s := startOnTestSchema(t, 500*time.Millisecond)
	defer closeStack(s)
	forwardOnTheStack(t, s)
}

// make dev TRANSPORT=nats: the same, the operations API creating the
// forwarder's durable consumer and the forwarders service pulling it.
func TestAForwarderOnTheLocalStackOnNATS(t *testing.T) {
	_, schema := pgtest.SchemaConfig(t, nil)
	s, err := Start(context.Background(), Options{
		Addr: "127.0.0.1:0", StateDir: t.TempDir(), Project: emutest.FirestoreProject(t),
		DatabaseURL: pgtest.SchemaURL(t, schema), FirestoreHost: emutest.Host(t, emulator.Firestore),
		RelayEvery: 500 * time.Millisecond, Transport: instance.TransportNATS,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer closeStack(s)
	forwardOnTheStack(t, s)
}

// forwardOnTheStack adds a forwarder through s's operations API,
// publishes three events through publish, checks they are forwarded in
// order, and removes the forwarder.
func forwardOnTheStack(t *testing.T, s *Stack) {
	t.Helper()
	got := make(chan string, 16)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("Ce-Id")
		w.WriteHeader(http.StatusOK)
	}))
	defer hook.Close()
	call := func(method, url string, body any) (int, map[string]any) {
		t.Helper()
		b, _ := json.Marshal(body)
		req, _ := http.NewRequest(method, url, bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out
	}
	if code, out := call("POST", s.Info.URL+"/dlqreplay/forwarders", map[string]any{"name": "crm-webhook",
		"topic": "shop.order.events", "url": hook.URL + "/hook"}); code != 200 {
		t.Fatalf("add: %d %v", code, out)
	}
	run := event.NewID()[:8]
	var ids []string
	for v := 1; v <= 3; v++ {
		code, res := call("POST", s.Info.URL+"/publish", map[string]any{"eventType": "order.purchased", "topic": "shop.order.events",
			"aggregateId": "order-" + run, "version": v, "source": "order-service",
			"payload": map[string]any{"orderId": "order-" + run, "memberId": "member-" + run, "amount": 5}})
		if code != http.StatusAccepted {
			t.Fatalf("publish: %d %v", code, res)
		}
		ids = append(ids, res["eventId"].(string))
	}
	timeout := time.After(time.Minute)
	for i, want := range ids {
		select {
		case id := <-got:
			if id != want {
				t.Fatalf("forwarded #%d: %s, want %s (in order: %v)", i+1, id, want, ids)
			}
		case <-timeout:
			t.Fatalf("the forwarder received %d of %v", i, ids)
		}
	}
	if code, out := call("DELETE", s.Info.URL+"/dlqreplay/forwarders/crm-webhook", nil); code != 200 {
		t.Fatalf("remove: %d %v", code, out)
	}
}
