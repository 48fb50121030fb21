// Package eventually is the one way relaybus's tests wait for something
// another process or goroutine does (a row committed, a message delivered,
// a server ready): poll a condition until it holds or a limit passes, then
// fail saying what never happened. Concurrency inside the test's own
// process is tested in a testing/synctest bubble instead, where time is
// the bubble's and synctest.Wait says when everything is blocked.
package eventually

import (
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/retry"
)

// poll spaces the looks at the condition: 5 ms doubling to 200 ms, ±20%.
var poll = retry.Policy{Initial: 5 * time.Millisecond, Max: 200 * time.Millisecond}

// True polls cond until it holds, and fails t (t.Fatalf, from the test's
// goroutine) naming what after within has passed without it. what says
// what the test waits for, e.g. "the outbox drained".
func True(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Within(within, cond) {
		t.Fatalf("after %v: %s never happened", within, what)
	}
}

// Within polls cond until it holds or within passes, and reports whether
// it held: for a test that reports the failure itself.
func Within(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	b := poll.Backoff()
	for !cond() {
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		time.Sleep(min(b.Next(), left))
	}
	return true
}
