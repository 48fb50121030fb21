// Package retry is relaybus's one backoff: every retry loop (the relay's
// failed publishes, the pull worker's refused deliveries and failed pulls,
// the pools' refused connections, the ledger's aborted writes, the client's
// retried requests, a function that cannot start, the local stack's
// delivery loop) waits the delays of a Policy: exponential, with jitter,
// drawn by github.com/cenkalti/backoff/v5's ExponentialBackOff. Each
// caller documents its own Policy beside its options.
package retry

import (
	"context"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// Defaults of Policy.
const (
	DefaultMultiplier = 2
	DefaultJitter     = 0.2
)

// Policy is an exponential backoff with jitter. The wait before retry n
// (n ≥ 1) is drawn uniformly from [d·(1−Jitter), d·(1+Jitter)], where d is
// Initial·Multiplier^(n−1) capped at Max, and is never longer than Max:
// callers refused together do not come back together, and a deadline
// computed from Max holds.
type Policy struct {
	// Initial is the first wait before jitter (required).
	Initial time.Duration
	// Max caps every wait (Initial when smaller).
	Max time.Duration
	// Multiplier grows the wait per retry (DefaultMultiplier when ≤ 1).
	Multiplier float64
	// Jitter is the spread of each wait, a fraction of it in [0, 1):
	// DefaultJitter when 0, none when negative.
	Jitter float64
	// NoShorter has the jitter only lengthen a wait: it is drawn from
	// [d, d·(1+Jitter)], still at most Max. For a policy that promises a
	// minimum between attempts, as Pub/Sub's retry policy does.
	NoShorter bool
}

func (p Policy) withDefaults() Policy {
	if p.Initial <= 0 {
		p.Initial = time.Millisecond
	}
	if p.Max < p.Initial {
		p.Max = p.Initial
	}
	if p.Multiplier <= 1 {
		p.Multiplier = DefaultMultiplier
	}
	switch {
	case p.Jitter == 0:
		p.Jitter = DefaultJitter
	case p.Jitter < 0:
		p.Jitter = 0
	case p.Jitter >= 1:
		p.Jitter = 0.99
	}
	return p
}

// maxSteps bounds the growth computed for a retry number: past it the
// wait is at Max whatever the policy (2^64 overflows any duration).
const maxSteps = 64

// Base returns the wait before retry n without jitter: Initial ·
// Multiplier^(n−1), at most Max.
func (p Policy) Base(n int) time.Duration {
	p = p.withDefaults()
	b := &backoff.ExponentialBackOff{InitialInterval: p.Initial, Multiplier: p.Multiplier, MaxInterval: p.Max}
	d := p.Initial
	for range min(max(n, 1), maxSteps) {
		d = b.NextBackOff()
	}
	return d
}

// Delay returns the wait before retry n (n ≥ 1; smaller counts as 1).
func (p Policy) Delay(n int) time.Duration {
	p = p.withDefaults()
	base := p.Base(n)
	d, f := base, p.Jitter
	if p.NoShorter {
		// [d, d·(1+J)] is d·(1+J/2) spread by (J/2)/(1+J/2).
		d, f = time.Duration(float64(base)*(1+f/2)), (f/2)/(1+f/2)
	}
	j := &backoff.ExponentialBackOff{InitialInterval: d, RandomizationFactor: f, Multiplier: 1, MaxInterval: d}
	w := min(j.NextBackOff(), p.Max)
	if p.NoShorter {
		w = max(w, base) // rounding
	}
	return w
}

// Backoff counts the retries of one loop and hands out their waits. The
// zero value is not usable: use Policy.Backoff.
type Backoff struct {
	p Policy
	n int
}

// Backoff returns a fresh count of retries under p.
func (p Policy) Backoff() *Backoff { return &Backoff{p: p} }

// Next returns the wait before the next retry.
func (b *Backoff) Next() time.Duration {
	b.n++
	return b.p.Delay(b.n)
}

// Reset starts the count again (after a success).
func (b *Backoff) Reset() { b.n = 0 }

// Retries is how many waits Next has handed out since the last Reset.
func (b *Backoff) Retries() int { return b.n }

// Sleep waits d, or until ctx ends, and returns ctx's error in that case.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
