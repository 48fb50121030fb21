package dlqreplay_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/internal/inbox"
)

// `relaybus consumers pause/resume` works for a forwarder added at run
// time as for a declared push consumer: its subscription's push endpoint
// is detached, the pause recorded as the operator's in the forwarders'
// database (so the forwarder's breaker probe never lifts it), and resume
// sets the endpoint back to the forwarders service under the forwarder's
// name. The delivery state and the consumers listing say who paused it,
// the forwarder's own breaker included.
func TestPauseAndResumeAForwarder(t *testing.T) {
	ctx := context.Background()
	s := newForwardersStack(t)
	hook := newWebhook(t)
	const topic, name = "shop.order.events", "crm-webhook"
	sub := topic + "." + name + "-forwarder"
	var added map[string]any
	if code := s.call(t, "POST", "/forwarders", map[string]any{"name": name, "topic": topic, "url": hook.url}, &added); code != 200 {
		t.Fatalf("POST /forwarders: %d %v", code, added)
	}
	endpoint, _ := added["forwarder"].(map[string]any)["pushEndpoint"].(string)
	pushing := func() string {
		t.Helper()
		e, err := s.fake.Client.PushEndpoint(ctx, sub)
		if err != nil {
			t.Fatal(err)
		}
		return e.URL
	}
	listed := func() map[string]any {
		t.Helper()
		var list map[string]any
		if code := s.call(t, "GET", "/consumers?topic="+topic, nil, &list); code != 200 {
			t.Fatalf("GET /consumers: %d %v", code, list)
		}
		cs, _ := list["consumers"].([]any)
		for _, c := range cs {
			if m, _ := c.(map[string]any); m["consumerId"] == name {
				return m
			}
		}
		t.Fatalf("GET /consumers lists no %s: %v", name, cs)
		return nil
	}
	if v := listed(); v["subscription"] != sub || v["paused"] != false || v["delivery"] != "push" {
		t.Fatalf("the forwarder listed: %v; want its subscription, pushed, not paused", v)
	}

	base := "/consumers/" + topic + "/" + name
	var st map[string]any
	if code := s.call(t, "POST", base+":pause", nil, &st); code != 200 || st["paused"] != true || st["changed"] != true ||
		st["control"] != dlqreplay.ControlPushEndpoint || st["pausedBy"] != inbox.PausedByOperator {
		t.Fatalf("pause: %d %v", code, st)
	}
	if got := pushing(); got != "" {
		t.Fatalf("paused, the forwarder's subscription pushes to %q", got)
	}
	if rec, ok, err := inbox.PushPauseOf(ctx, s.db, sub); err != nil || !ok || rec.By != inbox.PausedByOperator || rec.ConsumerID != name {
		t.Fatalf("the pause's record: %+v %v %v; want the operator's", rec, ok, err)
	}
	if code := s.call(t, "GET", base+"/delivery", nil, &st); code != 200 || st["paused"] != true || st["pausedBy"] != inbox.PausedByOperator {
		t.Fatalf("delivery state: %d %v", code, st)
	}

	// The forwarder's breaker paused it (its record as consume writes it):
	// the listing says so.
	if err := inbox.ClearPushPause(ctx, s.db, sub, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := inbox.PauseByBreaker(ctx, s.db, inbox.PushPause{Subscription: sub, ConsumerID: name, Endpoint: endpoint,
		Reason: "no answer", ProbeAfter: time.Now().Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if v := listed(); v["paused"] != true || v["pausedBy"] != inbox.PausedByBreaker {
		t.Fatalf("the forwarder its breaker paused, listed: %v; want paused by breaker", v)
	}

	// An operator's resume lifts it: the endpoint is the forwarders
	// service's, under the forwarder's name.
	if code := s.call(t, "POST", base+":resume", nil, &st); code != 200 || st["paused"] != false || st["changed"] != true {
		t.Fatalf("resume: %d %v", code, st)
	}
	if got := pushing(); got != endpoint || !strings.HasSuffix(got, "/forwarders/"+name) {
		t.Fatalf("resumed, the subscription pushes to %q, want %q", got, endpoint)
	}
	if _, ok, _ := inbox.PushPauseOf(ctx, s.db, sub); ok {
		t.Error("the pause's record stands after the operator's resume")
	}
	if v := listed(); v["paused"] != false || v["pausedBy"] != nil {
		t.Fatalf("resumed, listed: %v", v)
	}

	// A forwarder's state is its target's: a rebuild is refused, names
	// the backfill, and leaves its subscription pushing.
	rb := s.do(t, "POST", base+":rebuild", map[string]any{"time": time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)})
	if msg, _ := rb.body["message"].(string); rb.status != 409 || rb.body["code"] != "handler" ||
		!strings.Contains(msg, "is a forwarder") || !strings.Contains(msg, "backfill") {
		t.Errorf("rebuild of a forwarder: %d %s; want 409 handler, saying it is a forwarder and naming the backfill", rb.status, rb.raw)
	}
	if got := pushing(); got != endpoint {
		t.Errorf("after the refused rebuild, the subscription pushes to %q, want %q", got, endpoint)
	}

	// Removed while paused, its pause record goes with it: one added again
	// under its name is not held by the old operator's pause.
	if code := s.call(t, "POST", base+":pause", nil, &st); code != 200 || st["changed"] != true {
		t.Fatalf("pause again: %d %v", code, st)
	}
	if code := s.call(t, "DELETE", "/forwarders/"+name, nil, &st); code != 200 {
		t.Fatalf("DELETE: %d %v", code, st)
	}
	if rec, ok, err := inbox.PushPauseOf(ctx, s.db, sub); err != nil || ok {
		t.Errorf("after the removal the pause's record is %+v (%v, %v); want none", rec, ok, err)
	}

	// Not a forwarder, not declared: 404 as before.
	if code := s.call(t, "POST", "/consumers/"+topic+"/no-such-hook:pause", nil, &st); code != 404 {
		t.Errorf("pause of an unknown consumer: %d %v, want 404", code, st)
	}
	if rb := s.do(t, "POST", "/consumers/"+topic+"/no-such-hook:rebuild", map[string]any{"time": time.Now().UTC().Format(time.RFC3339)}); rb.status != 404 {
		t.Errorf("rebuild of an unknown consumer: %d %s, want 404", rb.status, rb.raw)
	}
}
