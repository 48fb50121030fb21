// Package flow holds a consumer's deliveries to its flow-control limits
// (the topology's max_in_flight and max_per_second): at most MaxInFlight
// at once in this process, and at most PerSecond a second, spaced by a
// token bucket of one token (golang.org/x/time/rate), so no one-second
// window holds more than PerSecond + 1 deliveries whatever the broker
// sends.
//
// A delivery over a limit waits, up to MaxWait, for a slot and then for
// its token; one that would wait longer is refused with a *LimitError
// naming the limit and how long until the gate could let it through. The
// push path answers that with 429 and Retry-After; the pull worker waits
// as long as its context allows (it pulls no more than it may hold).
//
// The limits are per process: on Cloud Run each consume instance holds
// its own, so the topology gives each instance an even share of the
// consumer's max_per_second (topology.Consumer.InstancePerSecond).
package flow

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Limit names (LimitError.Limit), as the topology spells them.
const (
	LimitInFlight  = "max_in_flight"
	LimitPerSecond = "max_per_second"
)

// Options are a gate's limits.
type Options struct {
	// MaxInFlight is the most deliveries the gate lets through at once; 0
	// or less is no bound.
	MaxInFlight int
	// PerSecond is the most deliveries a second the gate lets through; 0
	// or less is no limit.
	PerSecond float64
	// MaxWait bounds how long Acquire waits for a slot and a token before
	// it refuses; 0 or less waits as long as the context allows.
	MaxWait time.Duration
}

// LimitError is Acquire's refusal: the delivery would have waited longer
// than MaxWait. It was not let through and holds no slot or token.
type LimitError struct {
	// Limit is LimitInFlight or LimitPerSecond.
	Limit string
	// RetryAfter is how long until the gate could let it through (for
	// max_in_flight, MaxWait: a slot's release cannot be foreseen).
	RetryAfter time.Duration
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("flow control: the consumer is at its %s; try again in %s", e.Limit, e.RetryAfter.Round(time.Millisecond))
}

// Gate holds deliveries to Options' limits. It is safe for concurrent
// use; a nil *Gate lets everything through at once.
type Gate struct {
	o        Options
	slots    chan struct{} // nil: no in-flight bound
	lim      *rate.Limiter // nil: no rate limit
	inFlight atomic.Int64
	waiting  atomic.Int64
	refused  atomic.Int64
	// lastAtLimit is when a delivery last had to wait or was refused
	// (Unix nanoseconds; 0: never).
	lastAtLimit atomic.Int64
}

// New returns a gate over o, or nil when o sets no limit.
func New(o Options) *Gate {
	if o.MaxInFlight <= 0 && o.PerSecond <= 0 {
		return nil
	}
	g := &Gate{o: o}
	if o.MaxInFlight > 0 {
		g.slots = make(chan struct{}, o.MaxInFlight)
	}
	if o.PerSecond > 0 {
		g.lim = rate.NewLimiter(rate.Limit(o.PerSecond), 1)
	}
	return g
}

// Acquire waits for a slot and a token, within MaxWait and ctx, and
// returns the function that gives the slot back when the delivery is
// done. It returns a *LimitError when the wait would pass MaxWait, or
// ctx's error when ctx ends first.
func (g *Gate) Acquire(ctx context.Context) (release func(), err error) {
	if g == nil {
		return func() {}, nil
	}
	parent := ctx
	if g.o.MaxWait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, g.o.MaxWait)
		defer cancel()
	}
	g.waiting.Add(1)
	defer g.waiting.Add(-1)
	if g.slots != nil {
		select {
		case g.slots <- struct{}{}:
		default:
			g.atLimit()
			select {
			case g.slots <- struct{}{}:
			case <-ctx.Done():
				return nil, g.refuse(parent, LimitInFlight, g.o.MaxWait)
			}
		}
	}
	free := func() {
		if g.slots != nil {
			<-g.slots
		}
	}
	if g.lim != nil {
		r := g.lim.Reserve()
		d := r.Delay()
		if d > 0 {
			g.atLimit()
		}
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < d {
			// It would not get its token in time: refused now, the
			// token handed back.
			r.Cancel()
			free()
			if parent.Err() != nil {
				return nil, parent.Err()
			}
			g.refused.Add(1)
			return nil, &LimitError{Limit: LimitPerSecond, RetryAfter: d}
		}
		if d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				r.Cancel()
				free()
				return nil, g.refuse(parent, LimitPerSecond, r.Delay())
			}
		}
	}
	g.inFlight.Add(1)
	var once atomic.Bool
	return func() {
		if once.CompareAndSwap(false, true) {
			g.inFlight.Add(-1)
			free()
		}
	}, nil
}

// atLimit notes that a delivery is held by a limit now.
func (g *Gate) atLimit() { g.lastAtLimit.Store(time.Now().UnixNano()) }

// refuse answers a wait that ended: parent's error when the caller's
// context ended, else (MaxWait passed) a counted *LimitError.
func (g *Gate) refuse(parent context.Context, limit string, after time.Duration) error {
	if err := parent.Err(); err != nil {
		return err
	}
	g.refused.Add(1)
	return &LimitError{Limit: limit, RetryAfter: max(after, time.Millisecond)}
}

// State is what a gate knows of its limits now.
type State struct {
	// MaxInFlight and PerSecond are the gate's limits (0: none).
	MaxInFlight int     `json:"maxInFlight"`
	PerSecond   float64 `json:"maxPerSecond"`
	// InFlight are the deliveries let through and not yet done.
	InFlight int64 `json:"inFlight"`
	// Waiting are the deliveries waiting for a slot or a token.
	Waiting int64 `json:"waiting"`
	// Refused counts the deliveries refused since the gate was made.
	Refused int64 `json:"refused"`
	// AtLimit: a delivery is waiting, or every slot is taken.
	AtLimit bool `json:"atLimit"`
	// LastAtLimit is when a delivery last had to wait for a limit or was
	// refused (zero: never).
	LastAtLimit time.Time `json:"lastAtLimit,omitzero"`
}

// State returns the gate's counts (zero for a nil gate).
func (g *Gate) State() State {
	if g == nil {
		return State{}
	}
	s := State{MaxInFlight: g.o.MaxInFlight, PerSecond: g.o.PerSecond,
		InFlight: g.inFlight.Load(), Waiting: g.waiting.Load(), Refused: g.refused.Load()}
	s.AtLimit = s.Waiting > 0 || (s.MaxInFlight > 0 && s.InFlight >= int64(s.MaxInFlight))
	if n := g.lastAtLimit.Load(); n != 0 {
		s.LastAtLimit = time.Unix(0, n)
	}
	return s
}

// RetryAfterSeconds is a Retry-After header's value for wait: whole
// seconds, rounded up, at least 1.
func RetryAfterSeconds(wait time.Duration) int {
	return max(1, int(math.Ceil(wait.Seconds())))
}
