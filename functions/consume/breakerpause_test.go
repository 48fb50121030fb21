package consume

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/inbox"
	"github.com/relaybus/relaybus/internal/logging"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/internal/pubsubtest"
	"github.com/relaybus/relaybus/shared/broker"
	"github.com/relaybus/relaybus/shared/forward"
	"github.com/relaybus/relaybus/shared/topology"
)

// The breaker's pause never fights an operator's: an operator who pauses
// a consumer the breaker paused takes the pause over, and the probe then
// leaves it paused although the target answers; an operator's resume of a
// consumer the breaker paused is final (the probe finds nothing to do); a
// subscription an operator paused first is not touched by the breaker.
// The probe honours the target's own word: the configured request
// (FORWARD_PROBE), a 429 with Retry-After pushing the next probe back.
func TestBreakerPauseYieldsToOperators(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Schema(t)
	if err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	fake := pubsubtest.New(t)
	top, _ := topology.Load("")
	fake.Provision(t, top)
	sub := top.Topics[0].Consumers[0].Subscription()
	var (
		status atomic.Int64
		probes atomic.Int64
		seen   atomic.Value
	)
	status.Store(http.StatusOK)
	tg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		probes.Add(1)
		seen.Store(r.Method + " " + r.URL.Path)
		if status.Load() == http.StatusTooManyRequests {
			w.Header().Set("Retry-After", "600")
		}
		w.WriteHeader(int(status.Load()))
	}))
	t.Cleanup(tg.Close)
	fwd, err := forward.New(forward.Options{URL: tg.URL + "/events", Probe: forward.ProbeRequest{Method: http.MethodGet, Path: "/healthz"}})
	if err != nil {
		t.Fatal(err)
	}
	p := &breakerPause{breakerRuns: breakerRuns{on: true, timeout: 10 * time.Second}, db: pool, push: fake.Client, sub: sub, consumerID: "archive-service", fwd: fwd,
		breaker: forward.BreakerOptions{CoolDown: time.Second, MaxCoolDown: time.Minute}, log: logging.Discard(), now: time.Now}
	endpoint := broker.PushEndpoint{URL: "https://consume.example/", ServiceAccount: "consume@example.iam.gserviceaccount.com", Audience: "https://consume.example"}
	set := func(e broker.PushEndpoint) {
		t.Helper()
		if _, err := fake.Client.SetPushEndpoint(ctx, sub, e); err != nil {
			t.Fatal(err)
		}
	}
	pushing := func() string {
		t.Helper()
		e, err := fake.Client.PushEndpoint(ctx, sub)
		if err != nil {
			t.Fatal(err)
		}
		return e.URL
	}
	// What dlqreplay's pause and resume do (functions/dlqreplay/pause.go).
	operatorPause := func(who string) {
		t.Helper()
		if err := inbox.PauseByOperator(ctx, pool, sub, "archive-service", who); err != nil {
			t.Fatal(err)
		}
		set(broker.PushEndpoint{})
	}
	operatorResume := func() {
		t.Helper()
		set(endpoint)
		if err := inbox.ClearPushPause(ctx, pool, sub, ""); err != nil {
			t.Fatal(err)
		}
	}
	open := forward.Transition{From: forward.Closed, To: forward.Open, CoolDown: 0, Reason: "answered 503"}
	probe := func() probeReport {
		t.Helper()
		rep, err := p.probe(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	set(endpoint)

	// The breaker pauses; an operator pauses over it: the probe finds the
	// target up but leaves the operator's pause.
	if err := p.pause(ctx, open); err != nil || pushing() != "" {
		t.Fatalf("the breaker's pause: %v, pushing to %q", err, pushing())
	}
	operatorPause("alice@example.com")
	if rep := probe(); !rep.Paused || rep.PausedBy != inbox.PausedByOperator || rep.Probed || pushing() != "" {
		t.Fatalf("probe of an operator's pause over the breaker's: %+v, pushing to %q; want left paused, not probed", rep, pushing())
	}
	operatorResume()
	if rep := probe(); rep.Paused || rep.Probed || pushing() != endpoint.URL {
		t.Fatalf("probe after the operator's resume: %+v, pushing to %q", rep, pushing())
	}

	// An operator resumes a consumer the breaker paused: it stays resumed.
	if err := p.pause(ctx, open); err != nil || pushing() != "" {
		t.Fatalf("the breaker's pause: %v", err)
	}
	operatorResume()
	if rep := probe(); rep.Paused || pushing() != endpoint.URL {
		t.Fatalf("probe after an operator resumed the breaker's pause: %+v, pushing to %q", rep, pushing())
	}

	// An operator's pause first: the breaker leaves the subscription as it
	// is and records nothing of its own.
	operatorPause("bob@example.com")
	if err := p.pause(ctx, open); err != nil {
		t.Fatal(err)
	}
	if rec, ok, _ := inbox.PushPauseOf(ctx, pool, sub); !ok || rec.By != inbox.PausedByOperator {
		t.Fatalf("after the breaker opened over an operator's pause: %+v %v", rec, ok)
	}
	operatorResume()

	// The breaker's pause, the target answering 429 Retry-After: 600: still
	// down, the next probe not before ten minutes; then the configured
	// request finds it up and the endpoint and identity come back.
	if err := p.pause(ctx, open); err != nil {
		t.Fatal(err)
	}
	status.Store(http.StatusTooManyRequests)
	before := time.Now()
	rep := probe()
	if !rep.Paused || !rep.Probed || rep.NextProbe == nil || rep.NextProbe.Before(before.Add(599*time.Second)) {
		t.Fatalf("probe answered 429 Retry-After 600: %+v, want paused, next probe 10 minutes on", rep)
	}
	if rep := probe(); rep.Probed {
		t.Fatalf("probe within the target's Retry-After: %+v, want not probed", rep)
	}
	if got := seen.Load(); got != "GET /healthz" {
		t.Errorf("the probe sent %v, want GET /healthz (FORWARD_PROBE)", got)
	}
	if _, err := pool.Exec(ctx, `UPDATE relaybus_inbox_push_pause SET probe_after = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	status.Store(http.StatusNotFound) // an answer, and not "down": the target is up
	if rep := probe(); rep.Paused || !rep.Probed || rep.Breaker != "closed" {
		t.Fatalf("probe answered 404: %+v, want resumed, breaker closed", rep)
	}
	if e, _ := fake.Client.PushEndpoint(ctx, sub); e != endpoint {
		t.Fatalf("resumed push config %+v, want %+v", e, endpoint)
	}

	// Deliveries held by a breaker whose pause was lifted elsewhere (no
	// record, the endpoint attached) end its cool-down: the next delivery
	// probes. A subscription without an endpoint (the local stack's loop
	// pulls it) keeps the breaker's own cool-down.
	status.Store(http.StatusServiceUnavailable)
	fwd.ProbeTarget(ctx)
	set(broker.PushEndpoint{})
	p.held(ctx)
	if st := fwd.BreakerState(); st != forward.Open {
		t.Fatalf("held without an endpoint: breaker %s, want open", st)
	}
	set(endpoint)
	p.checked.Store(0)
	p.held(ctx)
	if st := fwd.BreakerState(); st != forward.HalfOpen {
		t.Fatalf("held with the pause lifted: breaker %s, want half-open (the next delivery probes)", st)
	}
}

// Over ordered push and Eventarc the breaker opens below the dead-letter
// threshold; elsewhere FORWARD_BREAKER_THRESHOLD stands.
func TestPushBreakerThreshold(t *testing.T) {
	top, err := topology.Load("")
	if err != nil {
		t.Fatal(err)
	}
	var push, eventarc string
	for _, c := range top.Consumers() {
		switch {
		case c.Delivery == topology.DeliveryPush && push == "":
			push = c.Subscription()
		case c.Delivery == topology.DeliveryEventarc && eventarc == "":
			eventarc = c.Subscription()
		}
	}
	if push == "" {
		t.Skip("the default topology has no push consumer")
	}
	for _, c := range []struct {
		name                      string
		sub, handler, mode        string
		threshold, attempts, want int
	}{
		{"push, the defaults", push, "forward", ModePush, 0, 5, 3},
		{"push, 5 of 5", push, "forward", ModePush, 5, 5, 3},
		{"push, below already", push, "forward", ModePush, 2, 5, 2},
		{"push, many attempts", push, "forward", ModePush, 5, 20, 5},
		{"push, off", push, "forward", ModePush, -1, 5, -1},
		{"pull", push, "forward", ModePull, 5, 5, 5},
		{"not forward", push, "projection", ModePush, 5, 5, 5},
	} {
		cfg := Config{Subscription: c.sub, Handler: c.handler, Mode: c.mode, ForwardBreakerThreshold: c.threshold, MaxDeliveryAttempts: c.attempts}
		if got := pushBreakerThreshold(cfg, top, logging.Discard()); got != c.want {
			t.Errorf("%s: threshold %d, want %d", c.name, got, c.want)
		}
	}
	if eventarc != "" {
		cfg := Config{Subscription: eventarc, Handler: "forward", Mode: ModePush, ForwardBreakerThreshold: 5, MaxDeliveryAttempts: 5}
		if got := pushBreakerThreshold(cfg, top, logging.Discard()); got != 3 {
			t.Errorf("eventarc: threshold %d, want 3 (Pub/Sub counts the failures before its breaker's pause, as over push)", got)
		}
	}
}
