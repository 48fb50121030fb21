package forward

import (
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Defaults of BreakerOptions.
const (
	// DefaultBreakerThreshold is how many calls in a row must find the
	// target down before the breaker opens.
	DefaultBreakerThreshold = 5
	// DefaultBreakerCoolDown is how long the breaker first stays open
	// before one delivery probes the target.
	DefaultBreakerCoolDown = 5 * time.Second
	// DefaultBreakerMaxCoolDown bounds the cool-down, which doubles at
	// each failed probe.
	DefaultBreakerMaxCoolDown = 5 * time.Minute
	// MaxRetryAfter bounds how long a target's Retry-After keeps the
	// breaker open (a date far ahead is taken as this).
	MaxRetryAfter = time.Hour
)

// BreakerOptions configure a forwarder's circuit breaker.
type BreakerOptions struct {
	// Threshold is how many calls in a row must find the target down
	// (no answer, a timeout, 5xx, 408 or 429) before the breaker opens
	// (DefaultBreakerThreshold; negative turns the breaker off).
	Threshold int
	// CoolDown is how long the breaker stays open before one delivery
	// probes the target (DefaultBreakerCoolDown); it doubles at each
	// failed probe, up to MaxCoolDown.
	CoolDown time.Duration
	// MaxCoolDown bounds the cool-down (DefaultBreakerMaxCoolDown).
	MaxCoolDown time.Duration
	// ProbeTimeout is how long a probe may be out without an outcome
	// before another delivery probes instead (a probe whose request could
	// not even be built reports none): CoolDown when zero; New sets the
	// forwarder's Timeout + LeaseMargin.
	ProbeTimeout time.Duration
}

// withDefaults fills the zero fields.
func (o BreakerOptions) withDefaults() BreakerOptions {
	if o.Threshold == 0 {
		o.Threshold = DefaultBreakerThreshold
	}
	if o.CoolDown <= 0 {
		o.CoolDown = DefaultBreakerCoolDown
	}
	if o.MaxCoolDown <= 0 {
		o.MaxCoolDown = DefaultBreakerMaxCoolDown
	}
	if o.MaxCoolDown < o.CoolDown {
		o.MaxCoolDown = o.CoolDown
	}
	if o.ProbeTimeout <= 0 {
		o.ProbeTimeout = o.CoolDown
	}
	return o
}

// State is a breaker's state.
type State int

// Breaker states.
const (
	// Closed: deliveries go to the target.
	Closed State = iota
	// HalfOpen: the cool-down is over; one delivery probes the target,
	// the others are held.
	HalfOpen
	// Open: the target is down; deliveries are held until the cool-down
	// ends.
	Open
)

// String is the state's name in logs and metrics: closed, half_open,
// open.
func (s State) String() string {
	switch s {
	case HalfOpen:
		return "half_open"
	case Open:
		return "open"
	}
	return "closed"
}

// Transition is one change of a breaker's state.
type Transition struct {
	From, To State
	// Failures is how many calls in a row found the target down.
	Failures int
	// CoolDown is how long the breaker stays open (To == Open).
	CoolDown time.Duration
	// Reason is what the call that caused it found ("" for the end of a
	// cool-down).
	Reason string
}

// Breaker is a circuit breaker's state machine, driven by the clock its
// caller passes: Allow before a call, Done after it. It is safe for
// concurrent use.
type Breaker struct {
	o BreakerOptions

	mu       sync.Mutex
	state    State
	failures int           // calls in a row that found the target down
	opens    int           // failed probes since the breaker last closed
	until    time.Time     // Open: when the cool-down ends
	probe    bool          // HalfOpen: a probe is out
	probeEnd time.Time     // HalfOpen: when the probe out counts as lost
	cool     time.Duration // the current cool-down
}

// NewBreaker returns a closed breaker (nil when o.Threshold is negative:
// a nil *Breaker lets every call through).
func NewBreaker(o BreakerOptions) *Breaker {
	if o.Threshold < 0 {
		return nil
	}
	return &Breaker{o: o.withDefaults()}
}

// State returns the breaker's state at now (an open breaker whose
// cool-down has ended reports HalfOpen).
func (b *Breaker) State(now time.Time) State {
	if b == nil {
		return Closed
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state == Open && !now.Before(b.until) {
		return HalfOpen
	}
	return b.state
}

// Allow says whether a call may go to the target at now. probe is true
// when the call is the half-open breaker's one probe: its caller reports
// it with Done, or with Cancel when it never reached the target. When
// not ok, wait is how long until the breaker may let a call through.
// tr is the transition Allow made (Open to HalfOpen), nil when none.
func (b *Breaker) Allow(now time.Time) (ok, probe bool, wait time.Duration, tr *Transition) {
	if b == nil {
		return true, false, 0, nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case Open:
		if now.Before(b.until) {
			return false, false, b.until.Sub(now), nil
		}
		b.state, b.probe, b.probeEnd = HalfOpen, true, now.Add(b.o.ProbeTimeout)
		return true, true, 0, &Transition{From: Open, To: HalfOpen, Failures: b.failures}
	case HalfOpen:
		if b.probe && now.Before(b.probeEnd) {
			// The probe is out: try again when it counts as lost at the
			// latest (its outcome changes the state before then).
			return false, false, b.probeEnd.Sub(now), nil
		}
		b.probe, b.probeEnd = true, now.Add(b.o.ProbeTimeout)
		return true, true, 0, nil
	}
	return true, false, 0, nil
}

// Held reports whether the breaker is open at now, and for how long
// still: a call that found the target down and left the breaker open is
// held back rather than failed (Forwarder.Handle).
func (b *Breaker) Held(now time.Time) (bool, time.Duration) {
	if b == nil {
		return false, 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state == Open && now.Before(b.until) {
		return true, b.until.Sub(now)
	}
	return false, 0
}

// EndCoolDown ends an open breaker's cool-down at now: the next call
// probes the target. Consume calls it when deliveries come again although
// its breaker paused them (the pause was lifted elsewhere).
func (b *Breaker) EndCoolDown(now time.Time) {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state == Open && now.Before(b.until) {
		b.until = now
	}
}

// Cancel gives back a probe that never reached the target (the delivery
// was a duplicate, another delivery held the event's claim): the next
// call probes instead.
func (b *Breaker) Cancel(probe bool) {
	if b == nil || !probe {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state == HalfOpen {
		b.probe = false
	}
}

// Done reports a call's outcome at now: down when it found the target
// down, with the target's Retry-After (0 when none) and a short reason.
// An outcome while half-open is the probe's (the only call let through
// then, or one older that tells as much). It returns the transition it
// made, nil when none.
func (b *Breaker) Done(now time.Time, down bool, retryAfter time.Duration, reason string) *Transition {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !down {
		b.failures = 0
		if b.state == HalfOpen {
			b.state, b.probe, b.opens = Closed, false, 0
			return &Transition{From: HalfOpen, To: Closed, Reason: reason}
		}
		return nil
	}
	b.failures++
	switch {
	case b.state == HalfOpen:
		// The probe failed: open again, for twice as long.
		b.opens++
		b.probe = false
		return b.open(now, HalfOpen, retryAfter, reason)
	case b.state == Closed && (b.failures >= b.o.Threshold || retryAfter > 0):
		// Enough calls in a row found the target down, or the target
		// asked for a pause (Retry-After).
		b.opens = 0
		return b.open(now, Closed, retryAfter, reason)
	}
	// Open already: a call let through before it opened.
	return nil
}

// open opens the breaker for the cool-down of b.opens failed probes, and
// at least retryAfter.
func (b *Breaker) open(now time.Time, from State, retryAfter time.Duration, reason string) *Transition {
	cool := b.o.CoolDownAfter(b.opens, retryAfter)
	b.state, b.until, b.cool = Open, now.Add(cool), cool
	return &Transition{From: from, To: Open, Failures: b.failures, CoolDown: cool, Reason: reason}
}

// CoolDownAfter is how long a breaker with these options stays open after
// failedProbes probes found the target down since it last closed: CoolDown
// doubled at each, at most MaxCoolDown, and at least the target's
// retryAfter (at most MaxRetryAfter). The zero fields take their defaults.
func (o BreakerOptions) CoolDownAfter(failedProbes int, retryAfter time.Duration) time.Duration {
	o = o.withDefaults()
	cool := o.CoolDown
	for i := 0; i < failedProbes && cool < o.MaxCoolDown; i++ {
		cool *= 2
	}
	cool = min(cool, o.MaxCoolDown)
	return max(cool, min(retryAfter, MaxRetryAfter))
}

// Probed reports the outcome at now of a probe made outside the
// deliveries (Forwarder.ProbeTarget, while the consumer's delivery is
// paused): up closes the breaker, whatever its state; down opens it (or
// keeps it open) for the next cool-down, counting a failed probe when it
// was open already. It returns the transition it made, nil when none.
func (b *Breaker) Probed(now time.Time, down bool, retryAfter time.Duration, reason string) *Transition {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	from := b.state
	if !down {
		b.failures, b.opens, b.probe = 0, 0, false
		if from == Closed {
			return nil
		}
		b.state = Closed
		return &Transition{From: from, To: Closed, Reason: reason}
	}
	b.failures++
	b.probe = false
	if from != Closed {
		b.opens++
	}
	tr := b.open(now, from, retryAfter, reason)
	if from == Open {
		return nil // still open: no change of state to report
	}
	return tr
}

// RetryAfter reads a Retry-After header (RFC 9110 section 10.2.3): a
// number of seconds, or an HTTP date (taken relative to now). It returns
// 0 when the header is absent, malformed, or in the past, and at most
// MaxRetryAfter.
func RetryAfter(h string, now time.Time) time.Duration {
	h = strings.TrimSpace(h)
	if h == "" {
		return 0
	}
	var d time.Duration
	if s, err := strconv.ParseInt(h, 10, 64); err == nil {
		if s <= 0 {
			return 0
		}
		if s > int64(MaxRetryAfter/time.Second) {
			return MaxRetryAfter
		}
		d = time.Duration(s) * time.Second
	} else if t, err := http.ParseTime(h); err == nil {
		d = t.Sub(now)
	}
	if d <= 0 {
		return 0
	}
	return min(d, MaxRetryAfter)
}
