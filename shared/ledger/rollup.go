package ledger

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"cloud.google.com/go/firestore"
)

// RollupResult says what Rollup found and did.
type RollupResult struct {
	EventID string
	// Previous is the status before; Status the status after.
	Previous, Status Status
	// Changed is true when this call wrote the new status.
	Changed bool
	// Coalesced is true when this call shared a run started for another
	// concurrent call of the same event (see Rollup); the run's write, if
	// any, is reported as Changed to that call alone, so a status change is
	// reported (and logged) once.
	Coalesced bool
	// Expected, Reported and Succeeded count the expected consumers, those
	// that made at least one attempt, and those whose latest succeeded.
	Expected, Reported, Succeeded int
	// Event is the event's document, without its payload.
	Event Event
}

// Rollup derives an event's status from the latest attempt of each of its
// expected consumers (the truth table in the package documentation) and
// writes it, in one Firestore transaction that reads the event document
// and its event_consumptions subcollection. It writes nothing when the
// status would not change, so repeated and concurrent rollups of the same
// event cost reads only, and the transaction makes concurrent ones
// serializable: whichever commits last read every attempt the others read,
// so the last status written is derived from all attempts recorded before
// the last rollup began. It fails with ErrEventNotFound when the event's
// document does not exist (yet): the rollup function answers non-2xx so
// that Pub/Sub brings the notice back after the relay has recorded the
// send.
//
// Cost: one read for the event, one per attempt of the event (at least
// one), and one write when the status changes.
//
// Within one process, concurrent rollups of the same event are coalesced:
// while one runs, the callers that arrive share a single follow-up run that
// starts after it, so every caller gets a result derived from reads that
// began after its call. This spares Firestore the lock contention of many
// transactions on one document; across processes the transaction alone
// keeps rollups correct.
func (s *Store) Rollup(ctx context.Context, eventID string) (RollupResult, error) {
	if err := checkEventID(eventID); err != nil {
		return RollupResult{}, fmt.Errorf("ledger: rollup: %w", err)
	}
	return s.flights.do(ctx, eventID, func(ctx context.Context) (RollupResult, error) { return s.rollup(ctx, eventID) })
}

// rollup is one rollup transaction.
func (s *Store) rollup(ctx context.Context, eventID string) (RollupResult, error) {
	ref := s.eventRef(eventID)
	var res RollupResult
	err := s.client.RunTransaction(ctx, func(ctx context.Context, tx *firestore.Transaction) error {
		res = RollupResult{EventID: eventID}
		snap, err := s.getDoc(ctx, OpRollup, tx, ref)
		if notFound(err) {
			return fmt.Errorf("%w: %s", ErrEventNotFound, eventID)
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", eventID, err)
		}
		var d Event
		if err := snap.DataTo(&d); err != nil {
			return fmt.Errorf("decode %s: %w", ref.ID, err)
		}
		attempts, err := s.readAttempts(ctx, OpRollup, tx, eventID)
		if err != nil {
			return err
		}
		now := s.clock()
		f := factsOf(&d, attempts, now)
		st := Derive(f)
		d.Payload = nil // not needed past here; keep results small
		res.Previous, res.Status, res.Event = d.Status, st, d
		res.Expected, res.Reported, res.Succeeded = counts(f)
		ups := statusUpdates(&d, st, now)
		if len(ups) == 0 {
			return nil
		}
		res.Changed = true
		return tx.Update(ref, append(ups, firestore.Update{Path: "updatedAt", Value: now}))
	})
	if err != nil {
		return RollupResult{EventID: eventID}, fmt.Errorf("ledger: rollup %s: %w", eventID, err)
	}
	if res.Changed {
		s.wrote(OpRollup, 1)
		res.Event.Status = res.Status
	}
	return res, nil
}

// counts returns how many expected consumers there are, how many reported
// and how many succeeded.
func counts(f Facts) (expected, reported, succeeded int) {
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

// DefaultExpireBatch is how many due events ExpireDue handles per call when
// given no limit.
const DefaultExpireBatch = 500

// ExpireReport says what ExpireDue did.
type ExpireReport struct {
	// Due is how many open events past their expireAt were found.
	Due int
	// Expired is how many of them are now EXPIRED.
	Expired int
	// More is true when the batch was full: call again.
	More bool
}

// ExpireDue rolls up open events whose expireAt has passed, so that events
// nobody reports on still become EXPIRED. Rollup notices do the same for
// events that are still being consumed; this sweep covers the silent ones.
// It reads the expiry index (shard, expireDue), which holds only open
// events with an expiry, up to limit of them (DefaultExpireBatch when <= 0).
// The rollup function serves it at POST /expire for Cloud Scheduler.
func (s *Store) ExpireDue(ctx context.Context, limit int) (ExpireReport, error) {
	if limit <= 0 {
		limit = DefaultExpireBatch
	}
	now := s.clock()
	q := shapeExpireDue.query(s.events.Query, nil)
	q = shapeExpireDue.withRange(q, nil, now.Add(time.Microsecond)).Select("eventId").Limit(limit)
	docs, err := s.queryDocs(ctx, OpExpire, nil, q)
	if err != nil {
		return ExpireReport{}, fmt.Errorf("ledger: expire: %w", err)
	}
	rep := ExpireReport{Due: len(docs), More: len(docs) == limit}
	var errs []error
	for _, d := range docs {
		id, _ := d.Data()["eventId"].(string)
		res, err := s.Rollup(ctx, id)
		if err != nil {
			if errors.Is(err, ErrEventNotFound) {
				continue
			}
			errs = append(errs, err)
			continue
		}
		if res.Status == StatusExpired {
			rep.Expired++
		}
	}
	if err := errors.Join(errs...); err != nil {
		return rep, fmt.Errorf("ledger: expire: %w", err)
	}
	return rep, nil
}

// coalescer runs at most one rollup per event at a time in this process,
// and folds the calls that arrive meanwhile into one follow-up run.
type coalescer struct {
	mu   sync.Mutex
	keys map[string]*flightState
}

type flightState struct {
	next *flight // the follow-up run, once a caller waits for one
}

type flight struct {
	ctx  context.Context
	run  func(context.Context) (RollupResult, error)
	done chan struct{} // closed when res and err are set
	res  RollupResult
	err  error
}

// followUpTimeout bounds a follow-up run, which outlives the call that
// queued it when that call gives up.
const followUpTimeout = time.Minute

func (c *coalescer) do(ctx context.Context, key string, run func(context.Context) (RollupResult, error)) (RollupResult, error) {
	c.mu.Lock()
	if c.keys == nil {
		c.keys = map[string]*flightState{}
	}
	st, running := c.keys[key]
	if !running {
		c.keys[key] = &flightState{}
		c.mu.Unlock()
		res, err := run(ctx)
		c.finish(key)
		return res, err
	}
	f, owner := st.next, false
	if f == nil {
		f, owner = &flight{ctx: context.WithoutCancel(ctx), run: run, done: make(chan struct{})}, true
		st.next = f
	}
	c.mu.Unlock()
	select {
	case <-f.done:
		if owner {
			return f.res, f.err
		}
		res := f.res
		res.Changed, res.Coalesced = false, true
		return res, f.err
	case <-ctx.Done():
		return RollupResult{}, fmt.Errorf("ledger: rollup %s: %w", key, ctx.Err())
	}
}

// finish ends the current run of key and starts the queued follow-up, if
// any, which every caller queued so far shares.
func (c *coalescer) finish(key string) {
	c.mu.Lock()
	st := c.keys[key]
	f := st.next
	if f == nil {
		delete(c.keys, key)
		c.mu.Unlock()
		return
	}
	st.next = nil
	c.mu.Unlock()
	go func() {
		ctx, cancel := context.WithTimeout(f.ctx, followUpTimeout)
		f.res, f.err = f.run(ctx)
		cancel()
		close(f.done)
		c.finish(key)
	}()
}
