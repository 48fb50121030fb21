package eventually

import (
	"testing"
	"testing/synctest"
	"time"
)

func TestWithinWaitsForTheCondition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		ready := start.Add(time.Second)
		if !Within(5*time.Second, func() bool { return !time.Now().Before(ready) }) {
			t.Fatal("the condition held after 1 s, but Within gave up")
		}
		if d := time.Since(start); d < time.Second || d > 1300*time.Millisecond {
			t.Errorf("returned after %v, want soon after the condition held (1 s)", d)
		}
	})
}

func TestWithinGivesUpAtItsLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		if Within(2*time.Second, func() bool { return false }) {
			t.Fatal("a condition that never holds held")
		}
		if d := time.Since(start); d != 2*time.Second {
			t.Errorf("gave up after %v, want its limit (2s)", d)
		}
	})
}
