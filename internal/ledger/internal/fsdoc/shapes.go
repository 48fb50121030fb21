package fsdoc

import (
	"fmt"
	"strings"

	"cloud.google.com/go/firestore"

	"github.com/relaybus/relaybus/internal/ledger/audit"
	"github.com/relaybus/relaybus/internal/ledger/model"
)

// Index orders, as infra/firestore/indexes.yaml spells them.
const (
	Ascending  = "ASCENDING"
	Descending = "DESCENDING"
)

// IndexField is one field of an index, with its order.
type IndexField struct {
	Field string `yaml:"field" json:"field"`
	Order string `yaml:"order" json:"order"`
}

// NameField is Firestore's name for the document id in indexes and queries.
const NameField = "__name__"

// QueryShape describes one query the store runs: which fields it compares
// for equality, which one it filters by range and how it orders. Every
// query the store sends is built from a shape in QueryShapes, and a test
// checks that infra/firestore/indexes.yaml declares the composite index each
// shape needs (the emulator needs none, so nothing else would notice a
// missing one before production does).
type QueryShape struct {
	// Name identifies the shape.
	Name string
	// Collection is the collection queried.
	Collection string
	// Equality are the fields compared with == (the shard field with
	// `in [0..MaxShards-1]`), in the order of the index.
	Equality []string
	// Range is the field of the range filters ("" when none); Firestore
	// requires it to be the first ordering field.
	Range string
	// OrderBy are the ordering fields after the equality ones. The document
	// name is implied as a last ordering field in the direction of the last
	// one (the page cursor's tie-breaker).
	OrderBy []IndexField
}

// Fields of the events documents used by queries.
const (
	FieldShard     = "shard"
	FieldStatus    = "status"
	FieldTopic     = "topic"
	FieldInitiator = "initiator.service"
	FieldTraceID   = "traceId"
	FieldOccurred  = "occurredAt"
	FieldExpireDue = "expireDue"
	FieldCheckAt   = "checkAt"
)

// Fields of the events documents the operators' searches add.
const (
	FieldEventType   = "eventType"
	FieldAggregateID = "aggregateId"
)

// NeedsComposite reports whether Firestore needs a composite index for the
// shape: it orders or filters by range on one field and filters or orders
// on another. Queries on one field, and on document names, are served by
// Firestore's automatic single-field indexes.
func (q QueryShape) NeedsComposite() bool {
	fields := map[string]bool{}
	for _, f := range q.Fields() {
		if f != NameField {
			fields[f] = true
		}
	}
	return len(fields) > 1 && (q.Range != "" || len(q.OrderBy) > 0)
}

// Fields lists every field the shape uses.
func (q QueryShape) Fields() []string {
	out := append([]string{}, q.Equality...)
	if q.Range != "" {
		out = append(out, q.Range)
	}
	for _, o := range q.OrderBy {
		out = append(out, o.Field)
	}
	return out
}

// Index returns the composite index the shape needs: the equality fields
// ascending, then the ordering fields.
func (q QueryShape) Index() []IndexField {
	var out []IndexField
	for _, f := range q.Equality {
		out = append(out, IndexField{Field: f, Order: Ascending})
	}
	return append(out, q.OrderBy...)
}

// Query builds the shape's query on base: equality filters from eq (every
// equality field must have a value; the shard field takes all shards),
// then the ordering, the document name last.
func (q QueryShape) Query(base firestore.Query, eq map[string]any) firestore.Query {
	for _, f := range q.Equality {
		if f == FieldShard {
			base = base.Where(FieldShard, "in", allShards())
			continue
		}
		v, ok := eq[f]
		if !ok {
			// A programming error: the caller picked the wrong shape.
			panic(fmt.Sprintf("ledger: query shape %s needs a value for %s", q.Name, f))
		}
		base = base.Where(f, "==", v)
	}
	for i, o := range q.OrderBy {
		dir := firestore.Asc
		if o.Order == Descending {
			dir = firestore.Desc
		}
		base = base.OrderBy(o.Field, dir)
		if i == len(q.OrderBy)-1 {
			base = base.OrderBy(firestore.DocumentID, dir)
		}
	}
	return base
}

// WithRange adds the shape's range filters: lo inclusive, hi exclusive
// (nil: unbounded).
func (q QueryShape) WithRange(base firestore.Query, lo, hi any) firestore.Query {
	if q.Range == "" {
		return base
	}
	if lo != nil {
		base = base.Where(q.Range, ">=", lo)
	}
	if hi != nil {
		base = base.Where(q.Range, "<", hi)
	}
	return base
}

func allShards() []int {
	s := make([]int, model.MaxShards)
	for i := range s {
		s[i] = i
	}
	return s
}

// The shapes. List's shapes are generated for every combination of its
// indexed filters; see ListShape.
var (
	// ShapeByTrace is one trace's events, newest first.
	ShapeByTrace = QueryShape{
		Name: "events_by_trace", Collection: model.CollectionEvents,
		Equality: []string{FieldTraceID}, Range: FieldOccurred,
		OrderBy: []IndexField{{FieldOccurred, Descending}},
	}
	// ShapeExpireDue is the open events past their expireAt (ExpireDue).
	ShapeExpireDue = QueryShape{
		Name: "events_expire_due", Collection: model.CollectionEvents,
		Equality: []string{FieldShard}, Range: FieldExpireDue,
		OrderBy: []IndexField{{FieldExpireDue, Ascending}},
	}
	// ShapeCheckDue is the events the reconciler is due to look at.
	ShapeCheckDue = QueryShape{
		Name: "events_check_due", Collection: model.CollectionEvents,
		Equality: []string{FieldShard}, Range: FieldCheckAt,
		OrderBy: []IndexField{{FieldCheckAt, Ascending}},
	}
	// ShapeConsumersByTopic is one topic's topic_consumers entries.
	ShapeConsumersByTopic = QueryShape{
		Name: "consumers_by_topic", Collection: model.CollectionConsumers,
		Equality: []string{FieldTopic},
	}
	// ShapeAllConsumers is every topic_consumers entry.
	ShapeAllConsumers = QueryShape{
		Name: "consumers_all", Collection: model.CollectionConsumers,
	}
	// ShapeAttemptsOfEvent is all of one event's event_consumptions
	// subcollection.
	ShapeAttemptsOfEvent = QueryShape{
		Name: "attempts_of_event", Collection: model.CollectionConsumptions,
	}
	// ShapeEventByName is one event by its document name.
	ShapeEventByName = QueryShape{
		Name: "event_by_name", Collection: model.CollectionEvents,
		Equality: []string{NameField},
	}
	listShapes = buildListShapes()
)

// Query shapes of the operators' console (Search, the overview, the
// registry audit). They are part of QueryShapes, so the index test checks
// infra/firestore/indexes.yaml against them too.
var (
	// ShapeByAggregate is one aggregate's events, newest first. Aggregate
	// ids may grow with time (ORD-2024-002, ORD-2024-003, ...), so the
	// index starts with the shard like the time-ordered ones.
	ShapeByAggregate = QueryShape{
		Name: "events_by_aggregate", Collection: model.CollectionEvents,
		Equality: []string{FieldShard, FieldAggregateID}, Range: FieldOccurred,
		OrderBy: []IndexField{{FieldOccurred, Descending}},
	}
	// ShapeByType is one event type's events, newest first.
	ShapeByType = QueryShape{
		Name: "events_by_type", Collection: model.CollectionEvents,
		Equality: []string{FieldShard, FieldEventType}, Range: FieldOccurred,
		OrderBy: []IndexField{{FieldOccurred, Descending}},
	}
	// ShapeCountByStatus counts the events of one status in a time
	// window: served by the List index (shard, status, occurredAt).
	ShapeCountByStatus = QueryShape{
		Name: "events_count_by_status", Collection: model.CollectionEvents,
		Equality: []string{FieldShard, FieldStatus}, Range: FieldOccurred,
		OrderBy: []IndexField{{FieldOccurred, Descending}},
	}
	// ShapeAuditByTime is the operators' audit log, newest first (a
	// handful of writes a day: a single-field index on a timestamp is
	// fine).
	ShapeAuditByTime = QueryShape{
		Name: "audit_by_time", Collection: audit.Collection,
		OrderBy: []IndexField{{audit.FieldAt, Descending}},
	}
	consoleShapes = []QueryShape{ShapeByAggregate, ShapeByType, ShapeCountByStatus, ShapeAuditByTime}
)

// listFilters are List's indexed equality filters, in index order.
var listFilters = []string{FieldStatus, FieldTopic, FieldInitiator}

func buildListShapes() map[string]QueryShape {
	out := map[string]QueryShape{}
	for mask := 0; mask < 1<<len(listFilters); mask++ {
		eq := []string{FieldShard}
		name := []string{"events_list"}
		for i, f := range listFilters {
			if mask&(1<<i) != 0 {
				eq = append(eq, f)
				name = append(name, strings.ReplaceAll(f, ".", "_"))
			}
		}
		out[listKey(eq[1:])] = QueryShape{
			Name: strings.Join(name, "_"), Collection: model.CollectionEvents,
			Equality: eq, Range: FieldOccurred,
			OrderBy: []IndexField{{FieldOccurred, Descending}},
		}
	}
	return out
}

func listKey(fields []string) string { return strings.Join(fields, ",") }

// ListShape returns the shape of a List query filtering on the given
// fields (a subset of listFilters, in their order).
func ListShape(fields []string) QueryShape {
	s, ok := listShapes[listKey(fields)]
	if !ok {
		panic("ledger: no list shape for " + listKey(fields))
	}
	return s
}

// QueryShapes returns every query shape the ledger's packages run.
func QueryShapes() []QueryShape {
	out := []QueryShape{ShapeByTrace, ShapeExpireDue, ShapeCheckDue, ShapeConsumersByTopic, ShapeAllConsumers, ShapeAttemptsOfEvent, ShapeEventByName}
	out = append(out, consoleShapes...)
	for _, k := range SortedKeys(listShapes) {
		out = append(out, listShapes[k])
	}
	return out
}
