package model

import (
	"sort"
	"time"
)

// Facts are what an event's status is derived from.
type Facts struct {
	// Expected are the consumers the event was sent to (Event.ExpectedConsumers).
	Expected []string
	// Latest holds each consumer's latest attempt (highest AttemptNo).
	// Consumers that are not expected may appear; they do not count.
	Latest map[string]Attempt
	// ExpireAt is the event's expiry, zero when it has none.
	ExpireAt time.Time
	// Now is the time the status is derived at.
	Now time.Time
	// Sent is true once the relay has handed the event to Pub/Sub.
	Sent bool
	// PublishFailure is the relay's latest failure to publish, if any.
	PublishFailure *PublishFailure
	// Repush is the latest operator re-push, if any.
	Repush *Repush
}

// Derive applies the status truth table (see internal/ledger's package documentation) to
// the facts. It is a pure function: the same facts give the same status.
func Derive(f Facts) Status {
	var succeeded, failed, parked int
	var retryable bool
	for _, c := range f.Expected {
		a, ok := f.Latest[c]
		switch {
		case !ok:
		case a.Success:
			succeeded++
		case a.Outcome == OutcomeParked:
			parked++ // received and held: neither a success nor a failure yet
		default:
			failed++
			if a.Outcome == OutcomeRetry {
				retryable = true
			}
		}
	}
	reported := succeeded + failed + parked

	// 1. Every expected consumer's latest attempt succeeded.
	if len(f.Expected) > 0 && succeeded == len(f.Expected) {
		return StatusConsumed
	}
	// 2. Past its expiry.
	if !f.ExpireAt.IsZero() && !f.Now.Before(f.ExpireAt) {
		return StatusExpired
	}
	// 3. Never published and nobody has reported: the outbox's side.
	if !f.Sent && reported == 0 {
		if f.PublishFailure != nil && f.PublishFailure.Final {
			return StatusFailed
		}
		return StatusPending
	}
	// 4. A re-push is still on its way to a consumer that has not succeeded.
	if RepushOutstanding(f) {
		return StatusRetrying
	}
	// 5. Some expected consumer's latest attempt failed.
	if failed > 0 {
		switch {
		case succeeded > 0:
			return StatusPartial
		case retryable:
			return StatusRetrying
		}
		return StatusFailed
	}
	// 6. No failures; someone has not reported, or holds the event parked
	// (or nobody is expected).
	return StatusSent
}

// RepushOutstanding reports whether the latest re-push addressed an
// expected consumer that has neither succeeded nor made an attempt since.
func RepushOutstanding(f Facts) bool {
	if f.Repush == nil || f.Repush.PublishFailed {
		return false
	}
	since := make(map[string]int, len(f.Repush.Since))
	for _, m := range f.Repush.Since {
		since[m.ConsumerID] = m.AttemptNo
	}
	for _, c := range f.Expected {
		mark, addressed := since[c]
		if !addressed {
			continue
		}
		a, ok := f.Latest[c]
		if ok && (a.Success || a.AttemptNo > mark) {
			continue
		}
		return true
	}
	return false
}

// ConsumerState is where one consumer stands with one event.
type ConsumerState string

// Consumer states, from the consumer's latest attempt.
const (
	// ConsumerWaiting: no attempt yet.
	ConsumerWaiting ConsumerState = "waiting"
	// ConsumerSucceeded: the latest attempt succeeded.
	ConsumerSucceeded ConsumerState = "succeeded"
	// ConsumerRetrying: the latest attempt failed and Pub/Sub will redeliver.
	ConsumerRetrying ConsumerState = "retrying"
	// ConsumerFailed: the latest attempt failed for good (failed, poison,
	// dead-lettered); only a re-push or replay tries again.
	ConsumerFailed ConsumerState = "failed"
	// ConsumerParked: a strict consumer holds the event until its
	// predecessor is applied (outcome parked).
	ConsumerParked ConsumerState = "parked"
	// ConsumerStalled: the event is parked and its predecessor has been
	// missing longer than the consumer's gap timeout (outcome stalled); an
	// operator replays the missing version or skips it.
	ConsumerStalled ConsumerState = "stalled"
)

// StateOf returns a consumer's state from its latest attempt (nil: none).
func StateOf(latest *Attempt) ConsumerState {
	switch {
	case latest == nil:
		return ConsumerWaiting
	case latest.Success:
		return ConsumerSucceeded
	case latest.Outcome == OutcomeRetry:
		return ConsumerRetrying
	case latest.Outcome == OutcomeParked:
		return ConsumerParked
	case latest.Outcome == OutcomeStalled:
		return ConsumerStalled
	}
	return ConsumerFailed
}

// LatestByConsumer keeps each consumer's highest-numbered attempt.
func LatestByConsumer(attempts []Attempt) map[string]Attempt {
	out := make(map[string]Attempt)
	for _, a := range attempts {
		if cur, ok := out[a.ConsumerID]; !ok || a.AttemptNo > cur.AttemptNo {
			out[a.ConsumerID] = a
		}
	}
	return out
}

// WithFolded returns an event's attempt documents together with the
// attempts its document keeps only as folded marks (Event.Latest: a
// consumer's latest attempt whose document was never written, the first
// attempt that succeeded at ledger level failures), ordered by consumer and
// attempt number. Every reader of an event's attempts goes through it, so
// a folded attempt and a written one look the same, and a ledger written
// before the fold (every attempt a document, marks without delivery
// facts) reads as it always did.
func WithFolded(d *Event, docs []Attempt) []Attempt {
	if len(d.Latest) == 0 {
		return docs
	}
	have := make(map[ConsumerMark]bool, len(docs))
	for _, a := range docs {
		have[ConsumerMark{ConsumerID: a.ConsumerID, AttemptNo: a.AttemptNo}] = true
	}
	out := docs
	for c, m := range d.Latest {
		if m.AttemptNo < 1 || have[ConsumerMark{ConsumerID: c, AttemptNo: m.AttemptNo}] {
			continue
		}
		out = append(out, m.Attempt(d, c))
	}
	SortAttempts(out)
	return out
}

// FactsOf gathers the facts of an event document and each consumer's
// latest attempt (LatestByConsumer).
func FactsOf(d *Event, latest map[string]Attempt, now time.Time) Facts {
	return Facts{
		Expected:       d.ExpectedConsumers,
		Latest:         latest,
		ExpireAt:       d.ExpireAt,
		Now:            now,
		Sent:           !d.SentAt.IsZero(),
		PublishFailure: d.PublishFailure,
		Repush:         d.Repush,
	}
}

// Open reports whether a status may still change without new attempts or
// operator action; the expiry sweep only looks at open events.
func (s Status) Open() bool { return s != StatusConsumed && s != StatusExpired }

// Settled reports whether a status stays as it is unless an operator acts
// (a re-push) or a consumer reports again: CONSUMED, EXPIRED and FAILED.
// The reconciler re-derives events whose status is not settled.
func (s Status) Settled() bool {
	return s == StatusConsumed || s == StatusExpired || s == StatusFailed
}

// SortAttempts orders attempts by consumer, then attempt number.
func SortAttempts(as []Attempt) {
	sort.Slice(as, func(i, j int) bool {
		if as[i].ConsumerID != as[j].ConsumerID {
			return as[i].ConsumerID < as[j].ConsumerID
		}
		return as[i].AttemptNo < as[j].AttemptNo
	})
}

// Counts returns how many expected consumers there are, how many reported
// and how many succeeded.
func Counts(f Facts) (expected, reported, succeeded int) {
	for _, c := range f.Expected {
		a, ok := f.Latest[c]
		if !ok {
			continue
		}
		reported++
		if a.Success {
			succeeded++
		}
	}
	return len(f.Expected), reported, succeeded
}
