package dlqreplay_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/internal/cloudevent"
	"github.com/relaybus/relaybus/internal/eventually"
	"github.com/relaybus/relaybus/internal/inbox"
	"github.com/relaybus/relaybus/internal/pull"
	"github.com/relaybus/relaybus/internal/pullengine"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/projection"
)

// A pull consumer on Pub/Sub (pstest), paused through the API: its real
// worker stops pulling, so the messages published meanwhile are never
// delivered (pstest counts no delivery of them); resumed, the worker
// applies them, each at its first attempt. (The rebuild's redelivery is
// observed on NATS: pstest cannot seek back.)
func TestPauseAndResumeAPullConsumerOnPubSub(t *testing.T) {
	ctx := context.Background()
	const topic, sub, consumerID = "member.points.events", "member.points.events.audit-service-recorder", "audit-service"
	e := newEnv(t, dlqreplay.AuthNone, "")
	e = newHandler(t, e, func(o *dlqreplay.Options) { o.Broker, o.PullConsumers = e.fake.Client, []string{sub} })
	if err := inbox.Migrate(ctx, e.db); err != nil {
		t.Fatal(err)
	}
	if err := projection.Migrate(ctx, e.db); err != nil {
		t.Fatal(err)
	}
	eng, err := consumer.New(consumer.Options{DB: e.db, ConsumerID: consumerID, Subscription: sub, Handler: projection.Latest(), DeadLetters: e.fake.Client})
	if err != nil {
		t.Fatal(err)
	}
	flags := &inbox.PauseFlags{DB: e.db, ConsumerID: consumerID, Every: 50 * time.Millisecond}
	counter := &countingEngine{Engine: pullengine.New(eng, flags), applied: map[string]int{}, attempts: map[string][]int{}}
	var skipped atomic.Int64
	paused := pullengine.Paused(flags, topic)
	w, err := pull.New(pull.Options{Source: e.fake.Client, Subscription: sub, Engine: counter, DeadLetters: e.fake.Client,
		Paused: func(ctx context.Context) (bool, time.Duration) {
			p, d := paused(ctx)
			if p {
				skipped.Add(1)
			}
			return p, d
		}})
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	defer func() {
		stop()
		<-done
	}()
	publish := func(from, to int64) {
		t.Helper()
		for v := from; v <= to; v++ {
			ev := &event.Event{ID: fmt.Sprintf("evt-m-1-%d", v), Type: "points.added", Source: "member-service", Topic: topic,
				AggregateType: "member", AggregateID: "m-1", Version: v, Payload: []byte(fmt.Sprintf(`{"points":%d}`, 10*v))}
			if err := ev.Prepare(time.Now(), event.Limits{}); err != nil {
				t.Fatal(err)
			}
			m, err := cloudevent.Encode(ev, event.EncodingJSON)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := e.fake.Client.Publish(ctx, topic, m); err != nil {
				t.Fatal(err)
			}
		}
	}
	applied := func() int { a, _, _ := counter.counts(); return a }
	deliveries := func(eventID string) int {
		n := 0
		for _, m := range e.fake.Server.Messages() {
			if m.Attributes[event.AttrEventID] == eventID {
				n += m.Deliveries
			}
		}
		return n
	}

	publish(1, 2)
	eventually.True(t, 10*time.Second, "the first 2 events applied", func() bool { return applied() == 2 })
	var st map[string]any
	if code := e.call(t, "POST", "/consumers/"+topic+"/"+consumerID+":pause", nil, &st); code != 200 || st["changed"] != true || st["control"] != dlqreplay.ControlConsumerFlag {
		t.Fatalf("pause: %d %v", code, st)
	}
	eventually.True(t, 10*time.Second, "the worker skipping pulls", func() bool { return skipped.Load() > 0 })
	publish(3, 4)
	seen := skipped.Load()
	eventually.True(t, 10*time.Second, "more pulls skipped", func() bool { return skipped.Load() >= seen+5 })
	if d3, d4 := deliveries("evt-m-1-3"), deliveries("evt-m-1-4"); d3 != 0 || d4 != 0 || applied() != 2 {
		t.Fatalf("while paused: versions 3 and 4 delivered %d and %d times, %d applied; want never delivered, 2 applied", d3, d4, applied())
	}
	if code := e.call(t, "POST", "/consumers/"+topic+"/"+consumerID+":resume", nil, &st); code != 200 || st["changed"] != true {
		t.Fatalf("resume: %d %v", code, st)
	}
	eventually.True(t, 10*time.Second, "all 4 applied after the resume", func() bool { return applied() == 4 })
	counter.mu.Lock()
	defer counter.mu.Unlock()
	for v := 1; v <= 4; v++ {
		if got := counter.attempts[fmt.Sprintf("evt-m-1-%d", v)]; len(got) != 1 || got[0] != 1 {
			t.Errorf("evt-m-1-%d applied at attempts %v; want once, at attempt 1", v, got)
		}
	}
}
