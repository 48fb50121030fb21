package dlqreplay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/relaybus/relaybus/functions/consume"
	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/internal/cloudevent"
	"github.com/relaybus/relaybus/internal/delivery"
	"github.com/relaybus/relaybus/internal/inbox"
	"github.com/relaybus/relaybus/internal/pubsubtest"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/projection"
	"github.com/relaybus/relaybus/shared/topology"
)

// An Eventarc consumer on Pub/Sub is paused by its own flag: Eventarc owns
// its trigger's subscription, and a refusal there would spend delivery
// attempts (Pub/Sub counts every nack towards the dead-letter policy). So
// the real consume handler keeps what Eventarc delivers while paused and
// acknowledges it (200, code paused, no attempt recorded); resume
// publishes the kept deliveries to the topic addressed to the consumer
// alone, and what the consumer's subscription then delivers is applied at
// its first attempt.
func TestPauseAndResumeAnEventarcConsumer(t *testing.T) {
	ctx := context.Background()
	const topic, id = "shop.order.events", "message-service"
	e := newEnv(t, dlqreplay.AuthNone, "")
	e = newHandler(t, e, func(o *dlqreplay.Options) { o.Auth, o.Broker = dlqreplay.AuthNone, e.fake.Client })
	var c topology.Consumer
	for _, k := range e.top.Consumers() {
		if k.Topic == topic && k.Service == id {
			c = k
		}
	}
	if c.Delivery != topology.DeliveryEventarc {
		t.Fatalf("the topology's %s on %s is delivered by %q; the test wants Eventarc", id, topic, c.Delivery)
	}
	if err := inbox.Migrate(ctx, e.db); err != nil {
		t.Fatal(err)
	}
	if err := projection.Migrate(ctx, e.db); err != nil {
		t.Fatal(err)
	}
	eng, err := consumer.New(consumer.Options{DB: e.db, ConsumerID: id, Handler: projection.Latest(), DeadLetters: e.fake.Client})
	if err != nil {
		t.Fatal(err)
	}
	fn, err := consume.New(consume.Options{Engine: eng, DB: e.db, Pausable: true, PauseEvery: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	defer fn.Close(ctx)
	csrv := httptest.NewServer(fn)
	defer csrv.Close()
	eventarcSub := "eventarc-europe-west1-message-service-sub-123"
	deliver := func(m event.Message) map[string]any {
		t.Helper()
		req, err := delivery.EventarcRequest(csrv.URL, pubsubtest.Project, topic, eventarcSub, m)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&out)
		if resp.StatusCode != 200 {
			t.Fatalf("consume answered %d %v; Eventarc would redeliver (an attempt spent)", resp.StatusCode, out)
		}
		return out
	}
	msg := func(v int64) event.Message {
		ev := &event.Event{ID: fmt.Sprintf("evt-o-1-%d", v), Type: "order.purchased", Source: "shop", Topic: topic,
			AggregateType: "order", AggregateID: "o-1", Version: v, Payload: []byte(`{"total":1}`)}
		if err := ev.Prepare(time.Now(), event.Limits{}); err != nil {
			t.Fatal(err)
		}
		m, err := cloudevent.Encode(ev, event.EncodingJSON)
		if err != nil {
			t.Fatal(err)
		}
		m.ID = "msg-" + ev.ID
		return m
	}
	count := func(table string) int {
		var n int
		if err := e.db.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE consumer_id = $1`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	base := "/consumers/" + topic + "/" + id
	var st map[string]any
	if code := e.call(t, "POST", base+":pause", nil, &st); code != 200 || st["paused"] != true || st["changed"] != true ||
		st["control"] != dlqreplay.ControlConsumerFlag || st["delivery"] != topology.DeliveryEventarc {
		t.Fatalf("pause: %d %v", code, st)
	}
	for v := int64(1); v <= 2; v++ {
		if out := deliver(msg(v)); out["code"] != consume.CodePaused {
			t.Fatalf("a delivery while paused: %v; want kept (code paused)", out)
		}
	}
	if n, a := count("relaybus_inbox_held"), count("relaybus_attempts"); n != 2 || a != 0 {
		t.Fatalf("while paused: %d deliveries kept, %d attempts; want 2 kept, no attempt", n, a)
	}
	if code := e.call(t, "GET", base+"/delivery", nil, &st); code != 200 || st["paused"] != true || st["held"] != float64(2) {
		t.Errorf("delivery state while paused: %d %v; want paused, 2 held", code, st)
	}

	// The consumer's subscription, as pstest has it, receives what resume publishes.
	if code := e.call(t, "POST", base+":resume", nil, &st); code != 200 || st["paused"] != false || st["changed"] != true ||
		st["republished"] != float64(2) || st["held"] != float64(0) {
		t.Fatalf("resume: %d %v; want 2 kept deliveries published again", code, st)
	}
	var got []event.Message
	for len(got) < 2 {
		ls, err := e.fake.Client.Pull(ctx, c.Subscription(), 10)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range ls {
			m := l.Message()
			if m.Attributes[topology.TargetConsumerAttr] != id {
				t.Errorf("republished %s without target_consumer %s: %v", m.ID, id, m.Attributes)
			}
			got = append(got, m)
			if err := l.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, m := range got {
		if out := deliver(m); out["outcome"] != "success" || out["attempt"] != float64(1) {
			t.Errorf("the republished %s delivered after the resume: %v; want applied at attempt 1", m.Attributes["event_id"], out)
		}
	}
	if n := count("relaybus_inbox"); n != 2 {
		t.Errorf("%d events applied after the resume; want 2", n)
	}
}
