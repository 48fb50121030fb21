package devstack

import (
	"context"
	"sync"
	"time"
)

// observerApp is the application_name of the Observer's own connections,
// which connection counts leave out.
const observerApp = "relaybus-observer"

// ConnectionSampler counts, at a fixed cadence, the client connections of
// the stack's Postgres server (pg_stat_activity) other than the
// Observer's own, and keeps the peak.
type ConnectionSampler struct {
	mu      sync.Mutex
	peak    int
	samples int
	errs    int
	stop    context.CancelFunc
	done    chan struct{}
}

// SampleConnections counts the server's client connections every interval
// until Stop. The server is the one the Observer's main database is on, so
// every database of the stack on it is counted.
func (ob *Observer) SampleConnections(ctx context.Context, every time.Duration) *ConnectionSampler {
	ctx, cancel := context.WithCancel(ctx)
	s := &ConnectionSampler{stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			var n int
			err := ob.Main.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE backend_type = 'client backend' AND application_name <> $1`, observerApp).Scan(&n)
			s.mu.Lock()
			if err == nil {
				s.samples++
				s.peak = max(s.peak, n)
			} else if ctx.Err() == nil {
				s.errs++
			}
			s.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// Stop ends the sampling and returns the peak, the number of samples taken
// and of samples that failed (the server down, for instance).
func (s *ConnectionSampler) Stop() (peak, samples, failed int) {
	s.stop()
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peak, s.samples, s.errs
}
