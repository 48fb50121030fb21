package forward

import (
	"net/http"
	"testing"
	"time"
)

// step is one event in a breaker's life: a call asked for (allow), or a
// call's outcome reported (done: down or not, with a Retry-After), or a
// probe given back (cancel), at t after the start.
type step struct {
	at     time.Duration
	op     string // allow, done, cancel
	down   bool
	retry  time.Duration
	wantOK bool          // allow: let through
	probe  bool          // allow: it is the probe
	wait   time.Duration // allow: the wait when refused
	state  State         // the state after the step
}

func TestBreakerStateMachine(t *testing.T) {
	o := BreakerOptions{Threshold: 3, CoolDown: time.Second, MaxCoolDown: 3 * time.Second}
	s := time.Second
	ms := time.Millisecond
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"failures below the threshold keep it closed; a success resets the count", []step{
			{op: "done", down: true, state: Closed},
			{op: "done", down: true, state: Closed},
			{op: "done", state: Closed},
			{op: "done", down: true, state: Closed},
			{op: "done", down: true, state: Closed},
			{op: "allow", wantOK: true, state: Closed},
		}},
		{"the threshold opens it; it refuses until the cool-down ends", []step{
			{op: "done", down: true, state: Closed},
			{op: "done", down: true, state: Closed},
			{op: "done", down: true, state: Open},
			{at: 400 * ms, op: "allow", wait: 600 * ms, state: Open},
			{at: s, op: "allow", wantOK: true, probe: true, state: HalfOpen},
			{at: s, op: "allow", wait: s, state: HalfOpen}, // the probe is out
			{at: s + 400*ms, op: "allow", wait: 600 * ms, state: HalfOpen},
			// A probe out for ProbeTimeout (CoolDown here) with no outcome
			// is lost: another delivery probes.
			{at: 2 * s, op: "allow", wantOK: true, probe: true, state: HalfOpen},
		}},
		{"a successful probe closes it", []step{
			{op: "done", down: true}, {op: "done", down: true}, {op: "done", down: true, state: Open},
			{at: s, op: "allow", wantOK: true, probe: true, state: HalfOpen},
			{at: s, op: "done", state: Closed},
			{at: s, op: "allow", wantOK: true, state: Closed},
		}},
		{"failed probes re-open it, the cool-down doubling up to its maximum", []step{
			{op: "done", down: true}, {op: "done", down: true}, {op: "done", down: true, state: Open},
			{at: s, op: "allow", wantOK: true, probe: true, state: HalfOpen},
			{at: s, op: "done", down: true, state: Open},
			{at: 2 * s, op: "allow", wait: s, state: Open}, // 2s cool-down from 1s
			{at: 3 * s, op: "allow", wantOK: true, probe: true, state: HalfOpen},
			{at: 3 * s, op: "done", down: true, state: Open}, // 4s, bounded to 3s
			{at: 5 * s, op: "allow", wait: s, state: Open},
			{at: 6 * s, op: "allow", wantOK: true, probe: true, state: HalfOpen},
			{at: 6 * s, op: "done", state: Closed},
			// Closed again: the cool-down starts over from CoolDown.
			{at: 6 * s, op: "done", down: true}, {at: 6 * s, op: "done", down: true}, {at: 6 * s, op: "done", down: true, state: Open},
			{at: 7 * s, op: "allow", wantOK: true, probe: true, state: HalfOpen},
		}},
		{"a probe that never reached the target is given back", []step{
			{op: "done", down: true}, {op: "done", down: true}, {op: "done", down: true, state: Open},
			{at: s, op: "allow", wantOK: true, probe: true, state: HalfOpen},
			{at: s, op: "cancel", state: HalfOpen},
			{at: s, op: "allow", wantOK: true, probe: true, state: HalfOpen},
		}},
		{"a Retry-After opens it at once, for at least that long", []step{
			{op: "done", down: true, retry: 10 * s, state: Open},
			{at: 9 * s, op: "allow", wait: s, state: Open},
			{at: 10 * s, op: "allow", wantOK: true, probe: true, state: HalfOpen},
			{at: 10 * s, op: "done", down: true, retry: 5 * s, state: Open}, // longer than the 2s cool-down
			{at: 14 * s, op: "allow", wait: s, state: Open},
		}},
		{"a late failure while open changes nothing", []step{
			{op: "done", down: true}, {op: "done", down: true}, {op: "done", down: true, state: Open},
			{at: 500 * ms, op: "done", down: true, state: Open},
			{at: s, op: "allow", wantOK: true, probe: true, state: HalfOpen},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := NewBreaker(o)
			t0 := time.Unix(1_700_000_000, 0)
			probe := false
			for i, st := range tc.steps {
				now := t0.Add(st.at)
				switch st.op {
				case "allow":
					ok, p, wait, _ := b.Allow(now)
					if ok != st.wantOK || p != st.probe || wait != st.wait {
						t.Fatalf("step %d: Allow = ok %v, probe %v, wait %s; want %v, %v, %s", i, ok, p, wait, st.wantOK, st.probe, st.wait)
					}
					probe = p
				case "done":
					b.Done(now, st.down, st.retry, "")
				case "cancel":
					b.Cancel(probe)
				}
				if got := b.State(now); got != st.state {
					t.Fatalf("step %d (%s at %s): state %s, want %s", i, st.op, st.at, got, st.state)
				}
			}
		})
	}
}

func TestBreakerTransitions(t *testing.T) {
	b := NewBreaker(BreakerOptions{Threshold: 2, CoolDown: time.Second})
	t0 := time.Unix(1_700_000_000, 0)
	if tr := b.Done(t0, true, 0, "a"); tr != nil {
		t.Fatalf("first failure: %+v, want no transition", tr)
	}
	tr := b.Done(t0, true, 0, "answered 503")
	if tr == nil || tr.From != Closed || tr.To != Open || tr.Failures != 2 || tr.CoolDown != time.Second || tr.Reason != "answered 503" {
		t.Fatalf("second failure: %+v", tr)
	}
	if _, _, _, tr := b.Allow(t0.Add(time.Second)); tr == nil || tr.From != Open || tr.To != HalfOpen {
		t.Fatalf("after the cool-down: %+v", tr)
	}
	if tr := b.Done(t0.Add(time.Second), false, 0, "answered 200"); tr == nil || tr.From != HalfOpen || tr.To != Closed {
		t.Fatalf("probe succeeded: %+v", tr)
	}
}

func TestBreakerOff(t *testing.T) {
	b := NewBreaker(BreakerOptions{Threshold: -1})
	if b != nil {
		t.Fatal("a negative threshold must turn the breaker off")
	}
	for range 10 {
		b.Done(time.Now(), true, time.Minute, "")
	}
	if ok, _, _, _ := b.Allow(time.Now()); !ok || b.State(time.Now()) != Closed {
		t.Fatal("an off breaker refused a call")
	}
}

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 11, 28, 4, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		h    string
		want time.Duration
	}{
		{"", 0},
		{"120", 2 * time.Minute},
		{" 5 ", 5 * time.Second},
		{"0", 0},
		{"-3", 0},
		{"1.5", 0},
		{"soon", 0},
		{"999999999", MaxRetryAfter},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second},
		{now.Add(-time.Minute).Format(http.TimeFormat), 0},
		{now.Add(48 * time.Hour).Format(http.TimeFormat), MaxRetryAfter},
		{"Saturday, 28-Nov-26 04:00:30 GMT", 30 * time.Second}, // RFC 850
		{now.Add(30 * time.Second).Format(time.ANSIC), 30 * time.Second},
	} {
		if got := RetryAfter(tc.h, now); got != tc.want {
			t.Errorf("RetryAfter(%q) = %s, want %s", tc.h, got, tc.want)
		}
	}
}
