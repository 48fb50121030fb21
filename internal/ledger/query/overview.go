package query

import (
	"context"
	"errors"
	"fmt"
	"github.com/relaybus/relaybus/internal/ledger/internal/fsdoc"
	"github.com/relaybus/relaybus/internal/ledger/model"
	"sort"
	"sync"
	"time"

	"cloud.google.com/go/firestore/apiv1/firestorepb"
)

// StatusCounts counts the events of each status that occurred at or after
// since, with one Firestore count aggregation per status over the List
// index (shard, status, occurredAt). A count is billed one read per 1,000
// index entries it scans, so bound since: the console asks for a day.
func (s *Reader) StatusCounts(ctx context.Context, since time.Time) (map[model.Status]int64, error) {
	out := make(map[model.Status]int64, len(model.Statuses))
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		errs []error
	)
	for _, st := range model.Statuses {
		wg.Add(1)
		go func() {
			defer wg.Done()
			q := fsdoc.ShapeCountByStatus.Query(s.events.Query, map[string]any{fsdoc.FieldStatus: string(st)})
			q = fsdoc.ShapeCountByStatus.WithRange(q, since.UTC(), nil)
			res, err := q.NewAggregationQuery().WithCount("n").Get(ctx)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("count %s: %w", st, err))
				return
			}
			v, ok := res["n"].(*firestorepb.Value)
			if !ok {
				errs = append(errs, fmt.Errorf("count %s: the answer has no count", st))
				return
			}
			out[st] = v.GetIntegerValue()
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("ledger: status counts: %w", err)
	}
	return out, nil
}

// Hops is when one event passed each hop of its delivery, as far as the
// ledger knows (a zero time is unknown).
type Hops struct {
	EventID    string       `json:"eventId"`
	Topic      string       `json:"topic"`
	Status     model.Status `json:"status"`
	OccurredAt time.Time    `json:"occurredAt"`
	// EnqueuedAt is the outbox commit (absent on events recorded before
	// the ledger kept it).
	EnqueuedAt time.Time `json:"enqueuedAt,omitzero"`
	// SentAt is when the relay handed it to Pub/Sub.
	SentAt time.Time `json:"sentAt,omitzero"`
	// StatusAt is when its status last changed: for a CONSUMED event, the
	// rollup that made it final.
	StatusAt time.Time `json:"statusAt,omitzero"`
	// Consumers holds each consumer's first successful commit, when the
	// attempts were read (see RecentHops).
	Consumers []ConsumerCommit `json:"consumers,omitempty"`
}

// ConsumerCommit is a consumer's first successful attempt at an event.
type ConsumerCommit struct {
	ConsumerID  string    `json:"consumerId"`
	CommittedAt time.Time `json:"committedAt"`
}

// hopFields are what RecentHops reads of each event.
var hopFields = []string{"eventId", "topic", "status", "occurredAt", "enqueuedAt", "sentAt", "statusAt", "latest"}

// RecentHops returns the hop times of the newest events (at most limit)
// that occurred at or after since, newest first; for the newest
// withAttempts of them it also reads the attempts (one query per event) to
// find each consumer's first successful commit.
func (s *Reader) RecentHops(ctx context.Context, since time.Time, limit, withAttempts int) ([]Hops, error) {
	if limit <= 0 || limit > MaxPageSize {
		limit = MaxPageSize
	}
	shape := fsdoc.ListShape(nil)
	q := shape.WithRange(shape.Query(s.events.Query, nil), since.UTC(), nil).Select(hopFields...).Limit(limit)
	docs, err := fsdoc.Query(ctx, nil, q)
	if err != nil {
		return nil, fmt.Errorf("ledger: recent hops: %w", err)
	}
	out := make([]Hops, 0, len(docs))
	evs := make([]model.Event, len(docs))
	for i, d := range docs {
		if err := d.DataTo(&evs[i]); err != nil {
			return nil, fmt.Errorf("ledger: recent hops: decode %s: %w", d.Ref.ID, err)
		}
		m := d.Data()
		h := Hops{}
		h.EventID, _ = m["eventId"].(string)
		h.Topic, _ = m["topic"].(string)
		st, _ := m["status"].(string)
		h.Status = model.Status(st)
		h.OccurredAt, _ = m["occurredAt"].(time.Time)
		h.EnqueuedAt, _ = m["enqueuedAt"].(time.Time)
		h.SentAt, _ = m["sentAt"].(time.Time)
		h.StatusAt, _ = m["statusAt"].(time.Time)
		out = append(out, h)
	}
	n := min(withAttempts, len(out))
	var (
		wg   sync.WaitGroup
		sem  = make(chan struct{}, 8)
		mu   sync.Mutex
		errs []error
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			attempts, err := fsdoc.EventAttempts(ctx, nil, s.client, &evs[i])
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
				return
			}
			out[i].Consumers = firstCommits(attempts)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("ledger: recent hops: %w", err)
	}
	return out, nil
}

// firstCommits returns each consumer's earliest successful attempt, by
// consumer id.
func firstCommits(attempts []model.Attempt) []ConsumerCommit {
	first := map[string]time.Time{}
	for _, a := range attempts {
		if a.Outcome != model.OutcomeSuccess || a.ConsumedAt.IsZero() {
			continue
		}
		if t, ok := first[a.ConsumerID]; !ok || a.ConsumedAt.Before(t) {
			first[a.ConsumerID] = a.ConsumedAt
		}
	}
	out := make([]ConsumerCommit, 0, len(first))
	for c, t := range first {
		out = append(out, ConsumerCommit{ConsumerID: c, CommittedAt: t})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ConsumerID < out[j].ConsumerID })
	return out
}

// ConsumedCounts says, for each event, how many of its expected consumers'
// latest attempts succeeded (the "n" of the console's "n/m consumed"). A
// CONSUMED event counts all of them without a read; the others read their
// attempts, at most 8 events at a time.
func (s *Reader) ConsumedCounts(ctx context.Context, events []model.Event) (map[string]int, error) {
	out := make(map[string]int, len(events))
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		sem  = make(chan struct{}, 8)
		errs []error
	)
	for _, e := range events {
		if e.Status == model.StatusConsumed || len(e.ExpectedConsumers) == 0 {
			mu.Lock() // the reads started before this event write out too
			out[e.EventID] = map[bool]int{true: len(e.ExpectedConsumers)}[e.Status == model.StatusConsumed]
			mu.Unlock()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			attempts, err := fsdoc.EventAttempts(ctx, nil, s.client, &e)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			out[e.EventID] = succeededCount(e.ExpectedConsumers, attempts)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("ledger: consumed counts: %w", err)
	}
	return out, nil
}

// succeededCount counts the expected consumers whose latest attempt (the
// highest attempt number) succeeded.
func succeededCount(expected []string, attempts []model.Attempt) int {
	latest := map[string]model.Attempt{}
	for _, a := range attempts {
		if cur, ok := latest[a.ConsumerID]; !ok || a.AttemptNo > cur.AttemptNo {
			latest[a.ConsumerID] = a
		}
	}
	n := 0
	for _, c := range expected {
		if a, ok := latest[c]; ok && a.Outcome == model.OutcomeSuccess {
			n++
		}
	}
	return n
}
