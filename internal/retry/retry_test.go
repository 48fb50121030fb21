package retry

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestBase(t *testing.T) {
	p := Policy{Initial: 10 * time.Second, Max: 10 * time.Minute}
	for _, c := range []struct {
		n    int
		want time.Duration
	}{{0, 10 * time.Second}, {1, 10 * time.Second}, {2, 20 * time.Second}, {3, 40 * time.Second}, {6, 320 * time.Second},
		{7, 10 * time.Minute}, {1000, 10 * time.Minute}} {
		if got := p.Base(c.n); got != c.want {
			t.Errorf("Base(%d) = %v, want %v", c.n, got, c.want)
		}
	}
	if got := (Policy{Initial: time.Second, Max: time.Minute, Multiplier: 3}).Base(3); got != 9*time.Second {
		t.Errorf("multiplier 3: Base(3) = %v, want 9s", got)
	}
}

// The waits spread over ±Jitter of the schedule and never pass Max.
func TestDelayJitter(t *testing.T) {
	p := Policy{Initial: 100 * time.Millisecond, Max: time.Second, Jitter: 0.5}
	for n := 1; n <= 8; n++ {
		base := p.Base(n)
		lo, hi := time.Duration(float64(base)*0.5), time.Duration(float64(base)*1.5)
		seen := map[time.Duration]bool{}
		for range 200 {
			d := p.Delay(n)
			if d < lo || d > min(hi, p.Max) {
				t.Fatalf("Delay(%d) = %v, outside [%v, %v]", n, d, lo, min(hi, p.Max))
			}
			seen[d] = true
		}
		if len(seen) < 10 {
			t.Errorf("Delay(%d): %d distinct waits in 200, want jitter", n, len(seen))
		}
	}
	floor := Policy{Initial: 100 * time.Millisecond, Max: time.Second, Jitter: 0.5, NoShorter: true}
	for n := 1; n <= 6; n++ {
		base := floor.Base(n)
		for range 200 {
			if d := floor.Delay(n); d < base || d > min(base*3/2, floor.Max) {
				t.Fatalf("NoShorter: Delay(%d) = %v, outside [%v, %v]", n, d, base, min(base*3/2, floor.Max))
			}
		}
	}
	none := Policy{Initial: 100 * time.Millisecond, Max: time.Second, Jitter: -1}
	for n := 1; n <= 5; n++ {
		if got, want := none.Delay(n), none.Base(n); got != want {
			t.Errorf("no jitter: Delay(%d) = %v, want %v", n, got, want)
		}
	}
}

func TestBackoffCounts(t *testing.T) {
	b := Policy{Initial: time.Millisecond, Max: 8 * time.Millisecond, Jitter: -1}.Backoff()
	var got []time.Duration
	for range 5 {
		got = append(got, b.Next())
	}
	want := []time.Duration{1, 2, 4, 8, 8}
	for i := range want {
		if got[i] != want[i]*time.Millisecond {
			t.Fatalf("waits %v, want 1ms 2ms 4ms 8ms 8ms", got)
		}
	}
	if b.Retries() != 5 {
		t.Errorf("Retries = %d, want 5", b.Retries())
	}
	b.Reset()
	if d := b.Next(); d != time.Millisecond {
		t.Errorf("after Reset: %v, want 1ms", d)
	}
}

func TestSleepEndsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Sleep(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Errorf("Sleep on a cancelled context = %v, want context.Canceled", err)
	}
	if err := Sleep(context.Background(), time.Millisecond); err != nil {
		t.Errorf("Sleep = %v", err)
	}
}
