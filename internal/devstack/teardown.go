package devstack

import (
	"context"
	"sync"
)

// teardown is what a stack has started and must stop: each step of Start
// pushes the stop of whatever it started, the moment it started it, and
// close runs them in the reverse order. A step that fails returns after
// pushing what it did start, so the failed Start's close stops everything
// started before the failure, that step's own half-started parts
// included. Steps that run at once (the services) push from their own
// goroutines.
type teardown struct {
	mu    sync.Mutex
	stops []func(context.Context)
}

// push adds stop to what close runs.
func (t *teardown) push(stop func(context.Context)) {
	t.mu.Lock()
	t.stops = append(t.stops, stop)
	t.mu.Unlock()
}

// close runs every stop pushed so far, the last pushed first, and forgets
// them: a second close stops nothing twice.
func (t *teardown) close(ctx context.Context) {
	t.mu.Lock()
	stops := t.stops
	t.stops = nil
	t.mu.Unlock()
	for i := len(stops) - 1; i >= 0; i-- {
		stops[i](ctx)
	}
}
