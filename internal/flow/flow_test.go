package flow

import (
	"context"
	"errors"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/eventually"
)

func TestNoLimitsIsNil(t *testing.T) {
	if g := New(Options{MaxWait: time.Second}); g != nil {
		t.Fatalf("New without limits = %v, want nil", g)
	}
	var g *Gate
	release, err := g.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	release()
	if s := g.State(); s != (State{}) {
		t.Errorf("nil gate state %+v", s)
	}
}

// The in-flight cap: deliveries that block hold their slots; no more than
// MaxInFlight are ever let through at once, the others wait (the gate is
// at its limit) and go through as slots are given back.
func TestInFlightCapHonoured(t *testing.T) {
	const limit, n = 3, 12
	g := New(Options{MaxInFlight: limit})
	var cur, peak, done atomic.Int64
	hold := make(chan struct{})
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			release, err := g.Acquire(context.Background())
			if err != nil {
				t.Error(err)
				return
			}
			c := cur.Add(1)
			for p := peak.Load(); c > p && !peak.CompareAndSwap(p, c); p = peak.Load() {
			}
			<-hold
			cur.Add(-1)
			release()
			done.Add(1)
		})
	}
	eventually.True(t, 10*time.Second, "3 in flight, 9 waiting", func() bool {
		s := g.State()
		return s.InFlight == limit && s.Waiting == n-limit
	})
	if s := g.State(); !s.AtLimit {
		t.Errorf("state %+v: want AtLimit", s)
	}
	for range n {
		hold <- struct{}{}
	}
	wg.Wait()
	if p := peak.Load(); p != limit {
		t.Errorf("peak deliveries at once %d, want %d", p, limit)
	}
	if s := g.State(); s.InFlight != 0 || s.Waiting != 0 || s.AtLimit || s.Refused != 0 {
		t.Errorf("after: %+v", s)
	}
}

// Over MaxWait, a delivery is refused naming the limit, holding nothing.
func TestRefusedPastMaxWait(t *testing.T) {
	g := New(Options{MaxInFlight: 1, MaxWait: 20 * time.Millisecond})
	release, err := g.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	_, err = g.Acquire(context.Background())
	var le *LimitError
	if !errors.As(err, &le) || le.Limit != LimitInFlight || le.RetryAfter <= 0 {
		t.Fatalf("second Acquire: %v, want a LimitError on max_in_flight", err)
	}
	release()
	release() // twice gives back one slot only
	if s := g.State(); s.InFlight != 0 || s.Refused != 1 {
		t.Errorf("state %+v: want nothing in flight, 1 refused", s)
	}
	r2, err := g.Acquire(context.Background())
	if err != nil {
		t.Fatalf("after the release: %v", err)
	}
	r2()

	// A token further off than MaxWait: refused at once, the token kept
	// for the next caller.
	g = New(Options{PerSecond: 1, MaxWait: 50 * time.Millisecond})
	if r, err := g.Acquire(context.Background()); err != nil {
		t.Fatal(err)
	} else {
		r()
	}
	_, err = g.Acquire(context.Background())
	if !errors.As(err, &le) || le.Limit != LimitPerSecond || le.RetryAfter < 500*time.Millisecond {
		t.Fatalf("over the rate: %v, want a LimitError on max_per_second, retry after most of a second", err)
	}
	if got := RetryAfterSeconds(le.RetryAfter); got != 1 {
		t.Errorf("Retry-After %d, want 1", got)
	}
}

// The caller's context ending is its error, not a refusal.
func TestContextEndIsNotARefusal(t *testing.T) {
	g := New(Options{MaxInFlight: 1, MaxWait: time.Minute})
	release, _ := g.Acquire(context.Background())
	defer release()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := g.Acquire(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire on a cancelled context: %v, want context.Canceled", err)
	}
	if s := g.State(); s.Refused != 0 {
		t.Errorf("refused %d, want 0", s.Refused)
	}
}

// held asserts the consumer was held to perSecond: a token bucket of one
// token made at or after start lets through, by any time t, at most
// 1 + perSecond·(t − start) deliveries; a delivery's time is taken after
// the gate let it through, never before, so load on the machine can only
// make the count smaller. (So no one-second window of the gate's grants
// holds more than perSecond + 1.)
func held(t *testing.T, start time.Time, times []time.Time, perSecond float64) {
	t.Helper()
	sort.Slice(times, func(i, j int) bool { return times[i].Before(times[j]) })
	for k, at := range times {
		allowed := 1 + perSecond*at.Sub(start).Seconds() + 1e-6
		if float64(k+1) > allowed {
			t.Fatalf("%d deliveries by %s after the start; held to %v/s, at most %.2f may be",
				k+1, at.Sub(start), perSecond, allowed)
		}
	}
}

func TestHeldToItsRate(t *testing.T) {
	const perSecond, n = 40.0, 30
	start := time.Now()
	g := New(Options{PerSecond: perSecond})
	var mu sync.Mutex
	var times []time.Time
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			release, err := g.Acquire(context.Background())
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			times = append(times, time.Now())
			mu.Unlock()
			release()
		})
	}
	wg.Wait()
	if len(times) != n {
		t.Fatalf("%d let through, want %d", len(times), n)
	}
	held(t, start, times, perSecond)
}

// LastAtLimit stays zero while every delivery goes straight through, and
// is set when one has to wait for a slot or a token, or is refused.
func TestLastAtLimit(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    Options
	}{
		{"a slot", Options{MaxInFlight: 1, MaxWait: 10 * time.Millisecond}},
		{"a token", Options{PerSecond: 0.1, MaxWait: 10 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := New(tc.o)
			release, err := g.Acquire(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if s := g.State(); !s.LastAtLimit.IsZero() {
				t.Fatalf("after a delivery let straight through: %+v, want LastAtLimit zero", s)
			}
			before := time.Now()
			var le *LimitError
			if _, err := g.Acquire(context.Background()); !errors.As(err, &le) {
				t.Fatalf("the second delivery: %v, want a *LimitError", err)
			}
			release()
			if s := g.State(); s.LastAtLimit.Before(before) || s.Refused != 1 {
				t.Errorf("after a refusal: %+v, want LastAtLimit set and 1 refused", s)
			}
		})
	}
}
