package query

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"time"

	"github.com/relaybus/relaybus/internal/ledger/internal/fsdoc"
	"github.com/relaybus/relaybus/internal/ledger/model"

	"cloud.google.com/go/firestore"

	"github.com/relaybus/relaybus/shared/event"
)

// SearchQuery is a ListQuery with the filters an operator adds in the
// console: the event type and the aggregate id.
type SearchQuery struct {
	ListQuery
	// EventType selects one event type (order.purchased).
	EventType string
	// AggregateID selects one aggregate's events.
	AggregateID string
}

func (q *SearchQuery) fingerprint() string {
	h := fnv.New64a()
	for _, s := range []string{q.ListQuery.fingerprint(), q.EventType, q.AggregateID} {
		_, _ = h.Write([]byte(s))
		_, _ = h.Write([]byte{0})
	}
	return "s" + strconv.FormatUint(h.Sum64(), 36)
}

// Search returns one page of events matching q, newest first. Without an
// event type or aggregate filter it is List. Otherwise the most selective
// filter picks the index (the aggregate id: (aggregateId, occurredAt desc);
// else a trace id: (traceId, occurredAt desc); else the event type:
// (shard, eventType, occurredAt desc)) and the other filters are applied to
// the events as they are read, at most MaxTraceScan per page: a page may
// then hold fewer events than asked and still have a next page.
func (s *Reader) Search(ctx context.Context, q SearchQuery) (Page, error) {
	if q.EventType == "" && q.AggregateID == "" {
		return s.List(ctx, q.ListQuery)
	}
	if q.Status != "" {
		if st, err := model.ParseStatus(string(q.Status)); err == nil {
			q.Status = st
		}
	}
	fp := q.fingerprint()
	token := q.PageToken
	q.PageToken = "" // checked against the search's own fingerprint below
	size, _, err := q.ListQuery.validate()
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	if q.EventType != "" && !validEventType(q.EventType) {
		errs = append(errs, &event.FieldError{Field: "eventType", Rule: "1 to 128 characters, dot-separated words of [A-Za-z0-9_-] (e.g. order.purchased)"})
	}
	if q.AggregateID != "" {
		if err := event.ValidateAggregateID(q.AggregateID); err != nil {
			errs = append(errs, err)
		}
	}
	var cur *pageToken
	if token != "" {
		t, err := decodeToken(token, fp)
		if err != nil {
			errs = append(errs, err)
		} else {
			cur = &t
		}
	}
	if err := errors.Join(errs...); err != nil {
		return Page{}, fmt.Errorf("ledger: search: %w", err)
	}
	var base firestore.Query
	switch {
	case q.AggregateID != "":
		base = fsdoc.ShapeByAggregate.Query(s.events.Query, map[string]any{fsdoc.FieldAggregateID: q.AggregateID})
		base = fsdoc.ShapeByAggregate.WithRange(base, timeOrNil(q.From), timeOrNil(q.To))
	case q.TraceID != "":
		base = fsdoc.ShapeByTrace.Query(s.events.Query, map[string]any{fsdoc.FieldTraceID: q.TraceID})
		base = fsdoc.ShapeByTrace.WithRange(base, timeOrNil(q.From), timeOrNil(q.To))
	default:
		base = fsdoc.ShapeByType.Query(s.events.Query, map[string]any{fsdoc.FieldEventType: q.EventType})
		base = fsdoc.ShapeByType.WithRange(base, timeOrNil(q.From), timeOrNil(q.To))
	}
	keep := func(e *model.Event) bool {
		return (q.Status == "" || e.Status == q.Status) && (q.Topic == "" || e.Topic == q.Topic) &&
			(q.InitiatorService == "" || e.Initiator.Service == q.InitiatorService) && (q.TraceID == "" || e.TraceID == q.TraceID) &&
			(q.EventType == "" || e.EventType == q.EventType) && (q.AggregateID == "" || e.AggregateID == q.AggregateID)
	}
	return s.scanPage(ctx, base.Select(summaryFields...), keep, size, cur, fp)
}

// scanPage reads q from the cursor, keeps the events keep accepts, and
// stops at size events or MaxTraceScan documents read.
func (s *Reader) scanPage(ctx context.Context, q firestore.Query, keep func(*model.Event) bool, size int, cur *pageToken, fp string) (Page, error) {
	if cur != nil {
		q = q.StartAfter(cur.T, cur.D)
	}
	docs, err := fsdoc.Query(ctx, nil, q.Limit(MaxTraceScan))
	if err != nil {
		return Page{}, fmt.Errorf("ledger: search: %w", err)
	}
	var (
		page   Page
		lastID string
		lastT  time.Time
	)
	for _, d := range docs {
		var e model.Event
		if err := d.DataTo(&e); err != nil {
			return Page{}, fmt.Errorf("ledger: search: decode %s: %w", d.Ref.ID, err)
		}
		if keep(&e) {
			if len(page.Events) == size {
				page.NextPageToken = encodeToken(lastT, lastID, fp)
				return page, nil
			}
			page.Events = append(page.Events, e)
		}
		lastID, lastT = d.Ref.ID, e.OccurredAt
	}
	if len(docs) == MaxTraceScan {
		page.NextPageToken = encodeToken(lastT, lastID, fp)
	}
	return page, nil
}

// validEventType is event.Event's rule for a type.
func validEventType(s string) bool {
	e := event.Event{Type: s}
	for _, fe := range event.FieldErrors(e.Validate(event.Limits{})) {
		if fe.Field == "eventType" {
			return false
		}
	}
	return true
}
