// Package ratelimit limits requests per caller: one token bucket per key
// (golang.org/x/time/rate), refilled at a steady rate up to a burst. The
// buckets live in the process: on Cloud Run each instance limits on its
// own, so a caller's ceiling is the rate times the instances serving it.
package ratelimit

import (
	"math"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// DefaultMaxKeys is how many callers' buckets are kept before idle ones are
// dropped.
const DefaultMaxKeys = 10000

// Options configure a Limiter.
type Options struct {
	// Rate is how many requests per second a caller may make, sustained;
	// zero or less turns the limiter off (New returns nil, which allows
	// everything).
	Rate float64
	// Burst is how many requests a caller may make at once (at least 1;
	// Rate rounded up when zero).
	Burst int
	// MaxKeys bounds the buckets kept (DefaultMaxKeys when zero): past it,
	// the buckets of callers idle long enough to be full again are
	// dropped, which changes nothing for them.
	MaxKeys int
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// Limiter holds one bucket per caller. A nil *Limiter allows everything.
type Limiter struct {
	o       Options
	refill  time.Duration // how long an empty bucket takes to fill
	mu      sync.Mutex
	buckets map[string]*bucket
}

type bucket struct {
	lim  *rate.Limiter
	seen time.Time
}

// New returns a limiter, or nil when o.Rate is not positive.
func New(o Options) *Limiter {
	if o.Rate <= 0 {
		return nil
	}
	if o.Burst <= 0 {
		o.Burst = int(math.Ceil(o.Rate))
	}
	if o.MaxKeys <= 0 {
		o.MaxKeys = DefaultMaxKeys
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Limiter{o: o, buckets: map[string]*bucket{},
		refill: time.Duration(float64(o.Burst) / o.Rate * float64(time.Second))}
}

// Rate is the sustained requests per second a caller may make.
func (l *Limiter) Rate() float64 { return l.o.Rate }

// Allow takes one token from key's bucket. When the bucket is empty it
// takes nothing and returns false and how long until a token is there.
func (l *Limiter) Allow(key string) (bool, time.Duration) {
	if l == nil {
		return true, 0
	}
	now := l.o.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.buckets[key]
	if !ok {
		if len(l.buckets) >= l.o.MaxKeys {
			l.sweep(now)
		}
		b = &bucket{lim: rate.NewLimiter(rate.Limit(l.o.Rate), l.o.Burst)}
		l.buckets[key] = b
	}
	b.seen = now
	r := b.lim.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return false, d
	}
	return true, 0
}

// sweep drops the buckets idle long enough to be full again; if none is,
// the oldest half goes (their callers get a full bucket back early).
func (l *Limiter) sweep(now time.Time) {
	for k, b := range l.buckets {
		if now.Sub(b.seen) >= l.refill {
			delete(l.buckets, k)
		}
	}
	if len(l.buckets) < l.o.MaxKeys {
		return
	}
	var cut time.Time
	seen := make([]time.Time, 0, len(l.buckets))
	for _, b := range l.buckets {
		seen = append(seen, b.seen)
	}
	cut = median(seen)
	for k, b := range l.buckets {
		if !b.seen.After(cut) {
			delete(l.buckets, k)
		}
	}
}

func median(ts []time.Time) time.Time {
	slices.SortFunc(ts, time.Time.Compare)
	return ts[len(ts)/2]
}

// RetryAfter sets the Retry-After header of a 429 to wait, in whole
// seconds rounded up (at least 1).
func RetryAfter(h http.Header, wait time.Duration) {
	s := int(math.Ceil(wait.Seconds()))
	if s < 1 {
		s = 1
	}
	h.Set("Retry-After", strconv.Itoa(s))
}
