package consume

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/inbox"
	"github.com/relaybus/relaybus/internal/logging"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/internal/pubsubtest"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/forward"
	"github.com/relaybus/relaybus/shared/topology"
)

// The breaker's pause of an Eventarc consumer by its flag never fights an
// operator's, by the push pause's rules: an operator who pauses a consumer
// the breaker paused takes the pause over, and the probe then leaves it
// paused although the target answers; an operator's resume of a consumer
// the breaker paused is final; a consumer an operator paused first is not
// touched by the breaker. The probe honours the target's own word (a 429
// with Retry-After pushes the next probe back), and its resume publishes
// what the pause kept, oldest first, addressed to the consumer alone.
func TestBreakerFlagYieldsToOperators(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Schema(t)
	if err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	fake := pubsubtest.New(t)
	top, _ := topology.Load("")
	fake.Provision(t, top)
	var c topology.Consumer
	for _, k := range top.Consumers() {
		if k.Delivery == topology.DeliveryEventarc && c.Service == "" {
			c = k
		}
	}
	if c.Service == "" {
		t.Skip("the default topology has no Eventarc consumer")
	}
	var status atomic.Int64
	status.Store(http.StatusOK)
	tg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if status.Load() == http.StatusTooManyRequests {
			w.Header().Set("Retry-After", "600")
		}
		w.WriteHeader(int(status.Load()))
	}))
	t.Cleanup(tg.Close)
	fwd, err := forward.New(forward.Options{URL: tg.URL + "/events"})
	if err != nil {
		t.Fatal(err)
	}
	pauses := &inbox.PauseFlags{DB: pool, ConsumerID: c.Service}
	p := &breakerFlag{breakerRuns: breakerRuns{on: true, timeout: 10 * time.Second}, db: pool, pub: fake.Client, pauses: pauses, consumerID: c.Service, topic: c.Topic, fwd: fwd,
		breaker: forward.BreakerOptions{CoolDown: time.Second, MaxCoolDown: time.Minute}, log: logging.Discard(), now: time.Now}
	open := forward.Transition{From: forward.Closed, To: forward.Open, Reason: "answered 503"}
	breakerPause := func() {
		t.Helper()
		p.transition(ctx, open)
		p.wg.Wait()
	}
	state := func() (inbox.FlagPause, bool) {
		t.Helper()
		rec, ok, err := inbox.FlagPauseOf(ctx, pool, c.Service, c.Topic)
		if err != nil {
			t.Fatal(err)
		}
		return rec, ok
	}
	// What dlqreplay's pause and resume do (functions/dlqreplay/pause.go).
	operator := func(paused bool, who string) bool {
		t.Helper()
		changed, err := inbox.SetPaused(ctx, pool, c.Service, c.Topic, paused, who)
		if err != nil {
			t.Fatal(err)
		}
		return changed
	}
	probe := func() flagProbeReport {
		t.Helper()
		rep, err := p.probe(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}

	// The breaker pauses; an operator pauses over it (a change: the pause
	// is now theirs); the probe finds the target up but leaves it.
	breakerPause()
	if rec, ok := state(); !ok || rec.By != inbox.PausedByBreaker {
		t.Fatalf("after the breaker opened: %+v %v, want paused by the breaker", rec, ok)
	}
	if paused, _ := pauses.Paused(ctx, c.Topic); !paused {
		t.Error("this process's view of the pause does not follow the breaker's at once")
	}
	if !operator(true, "alice@example.com") {
		t.Error("an operator's pause over the breaker's changed nothing; want it taken over")
	}
	if rep := probe(); !rep.Paused || rep.PausedBy != inbox.PausedByOperator || rep.Probed {
		t.Fatalf("probe of an operator's pause over the breaker's: %+v; want left paused, not probed", rep)
	}
	operator(false, "")
	if rep := probe(); rep.Paused || rep.Probed {
		t.Fatalf("probe after the operator's resume: %+v", rep)
	}

	// An operator resumes a consumer the breaker paused: it stays resumed.
	breakerPause()
	if !operator(false, "") {
		t.Error("an operator's resume of the breaker's pause changed nothing")
	}
	if rep := probe(); rep.Paused {
		t.Fatalf("probe after an operator resumed the breaker's pause: %+v", rep)
	}

	// An operator's pause first: the breaker leaves it the operator's.
	operator(true, "bob@example.com")
	breakerPause()
	if rec, ok := state(); !ok || rec.By != inbox.PausedByOperator || rec.Who != "bob@example.com" {
		t.Fatalf("after the breaker opened over an operator's pause: %+v %v", rec, ok)
	}
	operator(false, "")

	// The breaker's pause keeps two deliveries; the target answers 429
	// Retry-After: 600: still down, the next probe not before ten minutes;
	// then it answers and the resume publishes both, oldest first.
	breakerPause()
	for v := 1; v <= 2; v++ {
		m := event.Message{ID: fmt.Sprintf("m-%d", v), Data: fmt.Appendf(nil, `{"v":%d}`, v), OrderingKey: "o-1",
			Attributes: map[string]string{"event_id": fmt.Sprintf("e-%d", v)}}
		if kept, err := inbox.Hold(ctx, pool, c.Service, c.Topic, m); err != nil || !kept {
			t.Fatalf("Hold while the breaker pauses: %v, %v", kept, err)
		}
	}
	status.Store(http.StatusTooManyRequests)
	if _, err := pool.Exec(ctx, `UPDATE relaybus_inbox_pause SET probe_after = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	rep := probe()
	if !rep.Paused || !rep.Probed || rep.NextProbe == nil || rep.NextProbe.Before(before.Add(599*time.Second)) || rep.Republished != 0 {
		t.Fatalf("probe answered 429 Retry-After 600: %+v, want paused, next probe 10 minutes on, nothing republished", rep)
	}
	if rep := probe(); rep.Probed {
		t.Fatalf("probe within the target's Retry-After: %+v, want not probed", rep)
	}
	if _, err := pool.Exec(ctx, `UPDATE relaybus_inbox_pause SET probe_after = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	status.Store(http.StatusNotFound) // an answer, and not "down": the target is up
	if rep := probe(); rep.Paused || !rep.Probed || rep.Breaker != "closed" || rep.Republished != 2 {
		t.Fatalf("probe answered 404: %+v, want resumed, breaker closed, 2 republished", rep)
	}
	if _, ok := state(); ok {
		t.Fatal("the breaker's pause still stands after the resume")
	}
	var got []event.Message
	for len(got) < 2 {
		ls, err := fake.Client.Pull(ctx, c.Subscription(), 10)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range ls {
			got = append(got, l.Message())
			_ = l.Ack(ctx)
		}
	}
	for i, m := range got {
		if m.Attributes["event_id"] != fmt.Sprintf("e-%d", i+1) || m.Attributes[topology.TargetConsumerAttr] != c.Service || m.OrderingKey != "o-1" {
			t.Errorf("republished %d: %v key %q; want e-%d addressed to %s alone, key o-1", i, m.Attributes, m.OrderingKey, i+1, c.Service)
		}
	}

	// Deliveries held by a breaker whose pause was lifted elsewhere end
	// its cool-down: the next delivery probes.
	status.Store(http.StatusServiceUnavailable)
	fwd.ProbeTarget(ctx)
	p.held(ctx)
	if st := fwd.BreakerState(); st != forward.HalfOpen {
		t.Fatalf("held with no pause standing: breaker %s, want half-open (the next delivery probes)", st)
	}
}
