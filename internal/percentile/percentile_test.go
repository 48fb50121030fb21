package percentile

import (
	"testing"
	"time"
)

func TestRank(t *testing.T) {
	for _, c := range []struct {
		n    int
		p    float64
		want int
	}{
		{0, 0.5, -1},
		{1, 0.5, 0},
		{1, 0.99, 0},
		{2, 0.5, 0}, // ceil(1) = 1st
		{3, 0.5, 1}, // ceil(1.5) = 2nd
		{4, 0.5, 1}, // ceil(2) = 2nd
		{100, 0.99, 98},
		{100, 0.5, 49},
		{101, 0.99, 99}, // ceil(99.99) = 100th
		{1000, 0.999, 998},
		{10, 1, 9},
		{10, 0, 0},
		{10, 1.5, 9},
		{10, -1, 0},
	} {
		if got := Rank(c.n, c.p); got != c.want {
			t.Errorf("Rank(%d, %v) = %d, want %d", c.n, c.p, got, c.want)
		}
	}
}

func TestOf(t *testing.T) {
	xs := []float64{5, 1, 4, 2, 3, 10, 9, 8, 7, 6}
	for _, c := range []struct{ p, want float64 }{{0.5, 5}, {0.9, 9}, {0.91, 10}, {1, 10}, {0.1, 1}} {
		if got := Of(xs, c.p); got != c.want {
			t.Errorf("Of(1..10, %v) = %v, want %v", c.p, got, c.want)
		}
	}
	if got := Of(nil, 0.5); got != 0 {
		t.Errorf("Of(nil) = %v, want 0", got)
	}
	ds := []time.Duration{3 * time.Millisecond, time.Millisecond, 2 * time.Millisecond}
	if got := OfDurations(ds, 0.99); got != 3*time.Millisecond {
		t.Errorf("OfDurations p99 = %v, want 3ms", got)
	}
	if got := Sorted([]int64{1, 2, 3, 4}, 0.5); got != 2 {
		t.Errorf("Sorted p50 = %v, want 2", got)
	}
}
