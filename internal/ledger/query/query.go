package query

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"sort"
	"strconv"
	"time"

	"cloud.google.com/go/firestore"

	"github.com/relaybus/relaybus/internal/ledger/internal/fsdoc"
	"github.com/relaybus/relaybus/internal/ledger/model"
	"github.com/relaybus/relaybus/shared/event"
)

// Page sizes of List.
const (
	DefaultPageSize = 50
	MaxPageSize     = 500
)

// MaxTraceScan bounds how many events of one trace a List page with a trace
// filter, or a Trace, reads.
const MaxTraceScan = 1000

// ListQuery selects events, newest first (by occurredAt, then id). Every
// filter is optional and they combine with AND.
type ListQuery struct {
	Status           model.Status
	Topic            string
	InitiatorService string
	TraceID          string
	// From and To bound occurredAt: From inclusive, To exclusive.
	From, To time.Time
	// PageSize is at most MaxPageSize; zero means DefaultPageSize.
	PageSize int
	// PageToken is the NextPageToken of the previous page, empty for the
	// first. It is only valid with the same filters.
	PageToken string
}

// Page is one page of List's answer.
type Page struct {
	// Events are the page's events, without their payloads (Get has them).
	Events []model.Event
	// NextPageToken continues the listing; empty on the last page. A page
	// filtered by trace may hold fewer events than asked and still have a
	// next page.
	NextPageToken string
}

// summaryFields are the fields List and Trace read: everything but the
// payload.
var summaryFields = []string{
	"eventId", "eventType", "source", "topic", "aggregateType", "aggregateId", "version", "occurredAt",
	"schemaVersion", "payloadType", "payloadSize", "payloadOmitted", "traceId", "spanId", "parentEventId",
	"correlationId", "initiator", "expireAt", "status", "statusAt", "retryCount", "sentAt", "lastSentAt",
	"createdAt", "updatedAt", "expectedConsumers", "repush", "publishFailure", "latest",
}

// pageToken is the cursor inside a page token.
type pageToken struct {
	V int       `json:"v"`
	T time.Time `json:"t"`
	D string    `json:"d"`
	F string    `json:"f"`
}

func (q *ListQuery) fingerprint() string {
	h := fnv.New64a()
	for _, s := range []string{string(q.Status), q.Topic, q.InitiatorService, q.TraceID, q.From.UTC().Format(time.RFC3339Nano), q.To.UTC().Format(time.RFC3339Nano)} {
		_, _ = h.Write([]byte(s))
		_, _ = h.Write([]byte{0})
	}
	return strconv.FormatUint(h.Sum64(), 36)
}

func encodeToken(t time.Time, docID, fp string) string {
	b, _ := json.Marshal(pageToken{V: 1, T: t, D: docID, F: fp})
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeToken(s, fp string) (pageToken, error) {
	bad := &event.FieldError{Field: "pageToken", Rule: "must be a nextPageToken returned by a listing with the same filters"}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return pageToken{}, bad
	}
	var t pageToken
	if json.Unmarshal(b, &t) != nil || t.V != 1 || t.D == "" || t.F != fp {
		return pageToken{}, bad
	}
	return t, nil
}

// validate checks the query and returns its page size and cursor.
func (q *ListQuery) validate() (int, *pageToken, error) {
	var errs []error
	if q.Status != "" {
		if _, err := model.ParseStatus(string(q.Status)); err != nil {
			errs = append(errs, &event.FieldError{Field: "status", Rule: "one of PENDING, SENT, CONSUMED, PARTIAL, FAILED, RETRYING, EXPIRED"})
		}
	}
	if !q.From.IsZero() && !q.To.IsZero() && !q.From.Before(q.To) {
		errs = append(errs, &event.FieldError{Field: "to", Rule: "must be later than from"})
	}
	size := q.PageSize
	switch {
	case size == 0:
		size = DefaultPageSize
	case size < 0 || size > MaxPageSize:
		errs = append(errs, &event.FieldError{Field: "pageSize", Rule: "between 1 and " + strconv.Itoa(MaxPageSize)})
	}
	var cur *pageToken
	if q.PageToken != "" {
		t, err := decodeToken(q.PageToken, q.fingerprint())
		if err != nil {
			errs = append(errs, err)
		} else {
			cur = &t
		}
	}
	return size, cur, errors.Join(errs...)
}

// List returns one page of events matching q, newest first. Status, topic
// and initiator service filters, in any combination with a time range, are
// served by the composite indexes (shard, [status], [topic],
// [initiator.service], occurredAt desc); a trace filter is served by
// (traceId, occurredAt desc), with the other filters applied to the trace's
// events as they are read (a trace is small; at most MaxTraceScan events
// are read per page).
func (s *Reader) List(ctx context.Context, q ListQuery) (Page, error) {
	if q.Status != "" {
		if st, err := model.ParseStatus(string(q.Status)); err == nil {
			q.Status = st
		}
	}
	size, cur, err := q.validate()
	if err != nil {
		return Page{}, fmt.Errorf("ledger: list: %w", err)
	}
	if q.TraceID != "" {
		return s.listTrace(ctx, q, size, cur)
	}
	var fields []string
	eq := map[string]any{}
	for _, f := range []struct {
		field string
		value string
	}{{fsdoc.FieldStatus, string(q.Status)}, {fsdoc.FieldTopic, q.Topic}, {fsdoc.FieldInitiator, q.InitiatorService}} {
		if f.value != "" {
			fields = append(fields, f.field)
			eq[f.field] = f.value
		}
	}
	shape := fsdoc.ListShape(fields)
	fq := shape.WithRange(shape.Query(s.events.Query, eq), timeOrNil(q.From), timeOrNil(q.To)).Select(summaryFields...)
	if cur != nil {
		fq = fq.StartAfter(cur.T, cur.D)
	}
	docs, err := fsdoc.Query(ctx, nil, fq.Limit(size+1))
	if err != nil {
		return Page{}, fmt.Errorf("ledger: list: %w", err)
	}
	var page Page
	for i, d := range docs {
		if i == size {
			last := docs[size-1]
			page.NextPageToken = encodeToken(page.Events[size-1].OccurredAt, last.Ref.ID, q.fingerprint())
			break
		}
		var e model.Event
		if err := d.DataTo(&e); err != nil {
			return Page{}, fmt.Errorf("ledger: list: decode %s: %w", d.Ref.ID, err)
		}
		page.Events = append(page.Events, e)
	}
	return page, nil
}

func timeOrNil(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UTC()
}

// listTrace lists the events of one trace, applying the other filters as
// it reads.
func (s *Reader) listTrace(ctx context.Context, q ListQuery, size int, cur *pageToken) (Page, error) {
	fq := fsdoc.ShapeByTrace.WithRange(fsdoc.ShapeByTrace.Query(s.events.Query, map[string]any{fsdoc.FieldTraceID: q.TraceID}), timeOrNil(q.From), timeOrNil(q.To)).Select(summaryFields...)
	if cur != nil {
		fq = fq.StartAfter(cur.T, cur.D)
	}
	docs, err := fsdoc.Query(ctx, nil, fq.Limit(MaxTraceScan))
	if err != nil {
		return Page{}, fmt.Errorf("ledger: list: %w", err)
	}
	var page Page
	var lastID string
	var lastT time.Time
	for _, d := range docs {
		var e model.Event
		if err := d.DataTo(&e); err != nil {
			return Page{}, fmt.Errorf("ledger: list: decode %s: %w", d.Ref.ID, err)
		}
		if (q.Status != "" && e.Status != q.Status) || (q.Topic != "" && e.Topic != q.Topic) || (q.InitiatorService != "" && e.Initiator.Service != q.InitiatorService) {
			lastID, lastT = d.Ref.ID, e.OccurredAt
			continue
		}
		if len(page.Events) == size {
			page.NextPageToken = encodeToken(lastT, lastID, q.fingerprint())
			return page, nil
		}
		page.Events = append(page.Events, e)
		lastID, lastT = d.Ref.ID, e.OccurredAt
	}
	if len(docs) == MaxTraceScan {
		// Scanned the budget without reaching the end: continue from the
		// last event read.
		page.NextPageToken = encodeToken(lastT, lastID, q.fingerprint())
	}
	return page, nil
}

// Detail is one event with every attempt of every consumer.
type Detail struct {
	Event model.Event `json:"event"`
	// Consumers are the expected consumers in their order, then any
	// consumer that reported without being expected (added to the topic
	// after the event was sent), by id.
	Consumers []ConsumerReport `json:"consumers"`
	// Expected, Reported and Succeeded count expected consumers: all, those
	// with at least one attempt, those whose latest attempt succeeded.
	Expected  int `json:"expected"`
	Reported  int `json:"reported"`
	Succeeded int `json:"succeeded"`
}

// Summary reads like "1/2 consumed": consumers that succeeded of those
// expected.
func (d Detail) Summary() string {
	return strconv.Itoa(d.Succeeded) + "/" + strconv.Itoa(d.Expected) + " consumed"
}

// ConsumerReport is one consumer's history with one event.
type ConsumerReport struct {
	ConsumerID string `json:"consumerId"`
	// Expected is false for a consumer the event was not sent to.
	Expected bool                `json:"expected"`
	State    model.ConsumerState `json:"state"`
	// RepushPending is true while a re-push addressed to this consumer has
	// not been answered.
	RepushPending bool `json:"repushPending,omitempty"`
	// Attempts are all its attempts, by attempt number.
	Attempts []model.Attempt `json:"attempts"`
}

// Events returns the documents of the given events that the ledger holds,
// by event id, without their payloads: reads by id, fsdoc.MaxGetAll to a
// request, no query (over a loaded Firestore emulator a query scans the
// whole store). Ids the ledger does not hold are left out.
func (s *Reader) Events(ctx context.Context, eventIDs []string) (map[string]model.Event, error) {
	refs := make([]*firestore.DocumentRef, 0, len(eventIDs))
	for _, id := range eventIDs {
		if model.CheckEventID(id) == nil {
			refs = append(refs, fsdoc.EventRef(s.client, id))
		}
	}
	snaps, err := fsdoc.GetAll(ctx, s.client, refs)
	if err != nil {
		return nil, fmt.Errorf("ledger: events: %w", err)
	}
	out := make(map[string]model.Event, len(snaps))
	for _, snap := range snaps {
		if !snap.Exists() {
			continue
		}
		var e model.Event
		if err := snap.DataTo(&e); err != nil {
			return nil, fmt.Errorf("ledger: events: decode %s: %w", snap.Ref.ID, err)
		}
		e.Payload = nil
		out[e.EventID] = e
	}
	return out, nil
}

// Get returns an event with all its attempts grouped by consumer, read in
// one consistent snapshot. It fails with model.ErrEventNotFound when the ledger
// has no such event.
func (s *Reader) Get(ctx context.Context, eventID string) (Detail, error) {
	if err := model.CheckEventID(eventID); err != nil {
		return Detail{}, fmt.Errorf("ledger: get: %w", err)
	}
	var (
		d        model.Event
		attempts []model.Attempt
	)
	err := s.client.RunTransaction(ctx, func(ctx context.Context, tx *firestore.Transaction) error {
		snap, err := fsdoc.Get(ctx, tx, fsdoc.EventRef(s.client, eventID))
		if err != nil {
			if fsdoc.NotFound(err) {
				return fmt.Errorf("%w: %s", model.ErrEventNotFound, eventID)
			}
			return err
		}
		if err := snap.DataTo(&d); err != nil {
			return fmt.Errorf("decode %s: %w", snap.Ref.ID, err)
		}
		attempts, err = fsdoc.EventAttempts(ctx, tx, s.client, &d)
		return err
	}, firestore.ReadOnly)
	if err != nil {
		return Detail{}, fmt.Errorf("ledger: get %s: %w", eventID, err)
	}
	return detailOf(d, attempts), nil
}

// detailOf groups attempts by consumer.
func detailOf(d model.Event, attempts []model.Attempt) Detail {
	by := map[string][]model.Attempt{}
	for _, a := range attempts {
		by[a.ConsumerID] = append(by[a.ConsumerID], a)
	}
	f := model.Facts{Expected: d.ExpectedConsumers, Latest: model.LatestByConsumer(attempts), Repush: d.Repush}
	det := Detail{Event: d}
	det.Expected, det.Reported, det.Succeeded = model.Counts(f)
	report := func(c string, expected bool) ConsumerReport {
		as := by[c]
		if as == nil {
			as = []model.Attempt{}
		}
		var latest *model.Attempt
		if len(as) > 0 {
			latest = &as[len(as)-1]
		}
		r := ConsumerReport{ConsumerID: c, Expected: expected, State: model.StateOf(latest), Attempts: as}
		if expected && d.Repush != nil {
			r.RepushPending = model.RepushOutstanding(model.Facts{Expected: []string{c}, Latest: f.Latest, Repush: d.Repush})
		}
		return r
	}
	expected := map[string]bool{}
	for _, c := range d.ExpectedConsumers {
		expected[c] = true
		det.Consumers = append(det.Consumers, report(c, true))
	}
	for _, c := range fsdoc.SortedKeys(by) {
		if !expected[c] {
			det.Consumers = append(det.Consumers, report(c, false))
		}
	}
	return det
}

// Trace is the events of one trace as a tree.
type Trace struct {
	TraceID string `json:"traceId"`
	// Roots are the events whose parent is not in the trace (normally the
	// one that started it), by occurredAt.
	Roots []*TraceNode `json:"roots"`
	// Count is how many events the tree holds.
	Count int `json:"count"`
	// Truncated is true when the trace has more than MaxTraceScan events;
	// the tree then holds the newest MaxTraceScan.
	Truncated bool `json:"truncated,omitempty"`
}

// TraceNode is one event of a trace and the events its consumption emitted.
type TraceNode struct {
	Event model.Event `json:"event"`
	// Children are the events whose parentEventId is this event, by
	// occurredAt.
	Children []*TraceNode `json:"children,omitempty"`
}

// Trace returns the trace an event belongs to as a tree, parent to
// children (parentEventId), siblings ordered by occurredAt. An event
// without a trace id is a trace of its own. It fails with model.ErrEventNotFound
// when the ledger has no such event.
func (s *Reader) Trace(ctx context.Context, eventID string) (Trace, error) {
	if err := model.CheckEventID(eventID); err != nil {
		return Trace{}, fmt.Errorf("ledger: trace: %w", err)
	}
	docs, err := fsdoc.Query(ctx, nil, fsdoc.ShapeEventByName.Query(s.events.Query, map[string]any{fsdoc.NameField: fsdoc.EventRef(s.client, eventID)}).Select(summaryFields...))
	if err != nil {
		return Trace{}, fmt.Errorf("ledger: trace of %s: %w", eventID, err)
	}
	if len(docs) == 0 {
		return Trace{}, fmt.Errorf("ledger: trace of %s: %w", eventID, model.ErrEventNotFound)
	}
	var self model.Event
	if err := docs[0].DataTo(&self); err != nil {
		return Trace{}, fmt.Errorf("ledger: trace of %s: decode: %w", eventID, err)
	}
	nodes := []model.Event{self}
	tr := Trace{TraceID: self.TraceID}
	if self.TraceID != "" {
		q := fsdoc.ShapeByTrace.Query(s.events.Query, map[string]any{fsdoc.FieldTraceID: self.TraceID}).Select(summaryFields...).Limit(MaxTraceScan + 1)
		docs, err := fsdoc.Query(ctx, nil, q)
		if err != nil {
			return Trace{}, fmt.Errorf("ledger: trace %s: %w", self.TraceID, err)
		}
		if len(docs) > MaxTraceScan {
			tr.Truncated, docs = true, docs[:MaxTraceScan]
		}
		nodes = nodes[:0]
		seen := false
		for _, d := range docs {
			var e model.Event
			if err := d.DataTo(&e); err != nil {
				return Trace{}, fmt.Errorf("ledger: trace %s: decode %s: %w", self.TraceID, d.Ref.ID, err)
			}
			seen = seen || e.EventID == eventID
			nodes = append(nodes, e)
		}
		if !seen {
			nodes = append(nodes, self)
		}
	}
	tr.Roots, tr.Count = buildTree(nodes), len(nodes)
	return tr, nil
}

// buildTree links events by parentEventId.
func buildTree(events []model.Event) []*TraceNode {
	byID := make(map[string]*TraceNode, len(events))
	for _, e := range events {
		byID[e.EventID] = &TraceNode{Event: e}
	}
	var roots []*TraceNode
	for _, e := range events {
		n := byID[e.EventID]
		if p, ok := byID[e.ParentEventID]; ok && e.ParentEventID != e.EventID {
			p.Children = append(p.Children, n)
		} else {
			roots = append(roots, n)
		}
	}
	// Bad data can make a cycle (A's parent B, B's parent A): its events
	// hang off no root. Make the earliest of each such group a root.
	reached := make(map[*TraceNode]bool, len(events))
	var mark func(*TraceNode)
	mark = func(n *TraceNode) {
		if reached[n] {
			return
		}
		reached[n] = true
		for _, c := range n.Children {
			mark(c)
		}
	}
	for _, r := range roots {
		mark(r)
	}
	rest := make([]model.Event, 0)
	for _, e := range events {
		if !reached[byID[e.EventID]] {
			rest = append(rest, e)
		}
	}
	sort.Slice(rest, func(i, j int) bool { return rest[i].OccurredAt.Before(rest[j].OccurredAt) })
	for _, e := range rest {
		n := byID[e.EventID]
		if reached[n] {
			continue
		}
		p := byID[e.ParentEventID]
		for i, c := range p.Children {
			if c == n {
				p.Children = append(p.Children[:i], p.Children[i+1:]...)
				break
			}
		}
		roots = append(roots, n)
		mark(n)
	}
	var order func([]*TraceNode)
	order = func(ns []*TraceNode) {
		sort.Slice(ns, func(i, j int) bool {
			a, b := ns[i].Event, ns[j].Event
			if !a.OccurredAt.Equal(b.OccurredAt) {
				return a.OccurredAt.Before(b.OccurredAt)
			}
			return a.EventID < b.EventID
		})
		for _, n := range ns {
			order(n.Children)
		}
	}
	order(roots)
	return roots
}
