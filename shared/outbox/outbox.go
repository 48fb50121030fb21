// Package outbox is relaybus's transactional outbox in Postgres: a producer
// enqueues events in the same transaction as its business rows, and the relay
// publishes them to Pub/Sub afterwards, in per-aggregate version order.
//
// The table relaybus_outbox keeps the company-wide minimum columns (id,
// aggregatetype, aggregateid, event_type, version, payload, occurred_at) so
// that a Debezium outbox router can read it, plus the rest of the envelope;
// it is append-only. Dispatch state is per aggregate, in
// relaybus_outbox_dispatch (see migrations/003_dispatch_by_aggregate.sql):
// a published cursor, a lease with an epoch that fences relays out, the
// retry state of the aggregate's first unpublished version, and the
// ledger's own cursor. The relay claims aggregates ([Claim]), publishes each
// one's run of unpublished versions as one ordered bundle and settles a
// whole batch in one statement ([Settle]). Operators read the view
// relaybus_outbox_backlog.
//
// Every query is a .sql file under sql/, embedded.
package outbox

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/relaybus/relaybus/internal/migrate"
	"github.com/relaybus/relaybus/internal/traceparent"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/postgres"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Migrations is the outbox's migration line.
var Migrations = migrate.MustLoadFS("outbox", migrationFS, "migrations")

//go:embed sql/*.sql
var sqlFS embed.FS

// query returns the embedded query name (sql/<name>.sql).
func query(name string) string {
	b, err := sqlFS.ReadFile("sql/" + name + ".sql")
	if err != nil {
		panic("outbox: no query " + name)
	}
	return string(b)
}

var (
	enqueueSQL = query("enqueue")
	lookupSQL  = query("lookup")
)

// Migrate creates or upgrades the outbox tables in db's search_path.
func Migrate(ctx context.Context, db migrate.Beginner) error {
	_, err := Migrations.Apply(ctx, db)
	return err
}

// State is where an event is in its dispatch.
type State string

// Dispatch states.
const (
	// StatePending: waiting to be published (or to be retried, or behind a
	// FAILED version of its aggregate, or a re-push on its way).
	StatePending State = "pending"
	// StatePublished: Pub/Sub accepted it.
	StatePublished State = "published"
	// StateFailed: publishing failed the maximum number of times; the event
	// is kept for an operator and blocks its aggregate until re-pushed.
	StateFailed State = "failed"
	// StateCancelled: a scheduled event cancelled before it was due
	// ([Cancel]); it is never published.
	StateCancelled State = "cancelled"
)

// Enqueued reports what Enqueue did with one event, or (Lookup) where an
// event is.
type Enqueued struct {
	ID string
	// Duplicate is true when the outbox already held an event with this id;
	// nothing was written and the fields below describe the existing row.
	Duplicate bool
	State     State
	// Attempts and LastError are the failed publishes of the event while it
	// is its aggregate's first unpublished version.
	Attempts  int
	LastError string
	// PublishedAt is when its aggregate's cursor last moved (the event's
	// own publish, or a later one), once published.
	PublishedAt time.Time
	// Aggregate, Version, Topic and TraceID are the stored event's.
	Aggregate Aggregate
	Version   int64
	Topic     string
	TraceID   string
	// Target is the consumer a re-push (or the row) is addressed to.
	Target string
	// Reason says why a Producer skipped the event (State StateSkipped).
	Reason string
	// DeliverAt is when a scheduled event is due (zero: not scheduled).
	DeliverAt time.Time
}

// Aggregate names one aggregate: its type and id. An aggregate's events
// are published in version order, with its id as the ordering key.
type Aggregate struct {
	Type, ID string
}

// ErrVersionConflict means the aggregate already has a different event with
// the same version.
var ErrVersionConflict = errors.New("version conflict")

// ErrEventIDConflict means the outbox already holds another event under an
// id being enqueued: another topic, aggregate, version, event type or
// payload. A repeated id is a duplicate only when it repeats the same
// event; anything else is refused, so one producer cannot make another's
// event vanish as a "duplicate" by taking its id first. The error names the
// caller's own ids only, never what the other event holds.
var ErrEventIDConflict = errors.New("event id conflict")

// Enqueue writes events into the outbox through db, normally the caller's own
// transaction, so they are published if and only if it commits; it also
// records, on each aggregate's dispatch row, that the aggregate has work.
// Each event is prepared first (a missing id, occurrence time or trace id
// is filled in, see event.Prepare) and validated against Pub/Sub's hard
// limits; callers that enforce a smaller payload limit validate before.
// Enqueue is idempotent on event id: an id already in the outbox for the
// same event (topic, aggregate type and id, version, event type and
// payload) is reported as a duplicate with its current state, and nothing
// is written for it. An id the outbox holds for another event fails the
// call with ErrEventIDConflict, and an event whose aggregate already has
// that version under another id with ErrVersionConflict; either way the
// statement writes nothing. (Should another transaction write a different
// event under the same id at the same moment, Enqueue still answers
// ErrEventIDConflict, after its statement ran: pass a transaction, as
// producers do, to keep the call all or nothing.) The happy path is one
// statement.
//
// When ctx carries a span (telemetry on: an HTTP publish's request span, a
// Go producer's own span, a handler's span for the child events it emits),
// each row keeps its W3C traceparent, so the relay links to it and the
// consumers continue the trace; an event without a trace id takes the
// span's.
//
// Call the relay's kick (relay.Kicker) with the ids after the transaction
// commits to have them published within milliseconds instead of at the
// next scheduled drain.
//
// Enqueue does not check the event contract (the topic's schema, whether
// anyone consumes it): producers enqueue through a [Producer], which does,
// and so do handlers' Emit and the publish function.
func Enqueue(ctx context.Context, db postgres.DBTX, events ...*event.Event) ([]Enqueued, error) {
	if len(events) == 0 {
		return nil, nil
	}
	b, err := prepareBatch(ctx, events)
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, enqueueSQL, b.args()...)
	if err != nil {
		return nil, mapErr(err)
	}
	inserted := make(map[string]bool, len(events))
	var clashes []string
	for rows.Next() {
		var (
			id    string
			clash bool
		)
		if err := rows.Scan(&id, &clash); err != nil {
			rows.Close()
			return nil, mapErr(err)
		}
		if clash {
			clashes = append(clashes, id)
		} else {
			inserted[id] = true
		}
	}
	if err := rows.Err(); err != nil {
		return nil, mapErr(err)
	}
	if len(clashes) > 0 {
		return nil, idConflict(clashes)
	}
	return enqueued(ctx, db, events, func(id string) bool { return inserted[id] })
}

// prepareBatch prepares events (event.Prepare under Pub/Sub's limits, the
// trace id of ctx's span for one without) and gathers them, each id once,
// as the enqueue statements' arguments.
func prepareBatch(ctx context.Context, events []*event.Event) (*batch, error) {
	now := time.Now().UTC()
	b := &batch{}
	tp := traceparent.FromContext(ctx)
	seen := make(map[string]bool, len(events))
	for i, e := range events {
		if e.TraceID == "" && tp != "" {
			e.TraceID = tp[3:35]
		}
		if err := e.Prepare(now, event.Limits{MaxPayloadBytes: event.MaxClaimCheckPayload, ClaimCheck: true}); err != nil {
			return nil, fmt.Errorf("outbox: event %d (%s): %w", i, e.ID, err)
		}
		if seen[e.ID] {
			continue
		}
		seen[e.ID] = true
		b.add(e, tp)
	}
	return b, nil
}

// enqueued answers an enqueue statement that clashed with nothing: each
// event inserted is pending; the others were in the outbox already and are
// looked up (their state, and a clash with a row another transaction
// committed while the statement ran).
func enqueued(ctx context.Context, db postgres.DBTX, events []*event.Event, inserted func(id string) bool) ([]Enqueued, error) {
	out := make([]Enqueued, len(events))
	var dups []string
	for i, e := range events {
		out[i] = Enqueued{ID: e.ID, State: StatePending, Aggregate: Aggregate{e.AggregateType, e.AggregateID},
			Version: e.Version, Topic: e.Topic, TraceID: e.TraceID, DeliverAt: e.DeliverAt}
		if !inserted(e.ID) {
			out[i].Duplicate = true
			dups = append(dups, e.ID)
		}
	}
	if len(dups) > 0 {
		states, err := Lookup(ctx, db, dups...)
		if err != nil {
			return nil, err
		}
		var clashes []string
		for i, e := range events {
			if out[i].Duplicate {
				st, ok := states[out[i].ID]
				// The statement compared every field with the rows it could
				// see; a row committed by another transaction during it is
				// compared here, on what Lookup returns.
				if ok && (st.Topic != e.Topic || st.Aggregate != out[i].Aggregate || st.Version != e.Version) {
					clashes = append(clashes, e.ID)
				}
				st.Duplicate = true
				out[i] = st
			}
		}
		if len(clashes) > 0 {
			return nil, idConflict(clashes)
		}
	}
	return out, nil
}

// IDConflictError is the error of an Enqueue refused for ids the outbox
// holds for other events; it matches ErrEventIDConflict (errors.Is).
type IDConflictError struct {
	// IDs are the caller's event ids that clashed.
	IDs []string
}

// Error says the id is taken by another event, without saying which.
func (e *IDConflictError) Error() string {
	return "outbox: eventId " + strings.Join(e.IDs, ", ") + ": the outbox already holds another event under this id (a repeated id must repeat the same topic, aggregate, version, event type and payload); nothing was written: " + ErrEventIDConflict.Error()
}

// Is makes errors.Is(err, ErrEventIDConflict) true.
func (e *IDConflictError) Is(target error) bool { return target == ErrEventIDConflict }

// idConflict is the ErrEventIDConflict of the given ids.
func idConflict(ids []string) error { return &IDConflictError{IDs: ids} }

// ErrPending means a re-push found the event still waiting to be published.
var ErrPending = errors.New("event is still pending in the outbox")

// Repush queues an event again, as an operator's re-push does, addressed
// to target alone when target is not empty (the relay sets the
// target_consumer attribute that every other consumer's subscription
// filters out):
//
//   - an event its aggregate FAILED at: the failure is cleared (attempts
//     back to 0) and the aggregate flows again from it;
//   - a published event: a re-push is queued, which the relay publishes
//     again outside the aggregate's run (the consumers' version gates keep
//     order);
//   - an event retention has deleted: it is inserted again from e (as
//     published) and a re-push queued.
//
// An event that is still pending, or whose previous re-push is still on
// its way, is left alone and ErrPending returned.
//
// db is a pool (Repush runs its own transaction) or the caller's
// transaction.
func Repush(ctx context.Context, db postgres.DBTX, e *event.Event, target string) (Enqueued, error) {
	if err := e.Prepare(time.Now().UTC(), event.Limits{MaxPayloadBytes: event.MaxClaimCheckPayload, ClaimCheck: true}); err != nil {
		return Enqueued{}, fmt.Errorf("outbox: re-push %s: %w", e.ID, err)
	}
	b, ok := db.(migrate.Beginner)
	if !ok {
		return Enqueued{}, fmt.Errorf("outbox: re-push %s: the database handle cannot begin a transaction", e.ID)
	}
	var out Enqueued
	err := pgx.BeginFunc(ctx, b, func(tx pgx.Tx) error {
		var (
			aggType, aggID string
			version        int64
			cursor         *int64
			failed         *int64
			queued         bool
		)
		err := tx.QueryRow(ctx, repushFindSQL, e.ID).Scan(&aggType, &aggID, &version, &cursor, &failed, &queued)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			// Deleted by retention: back in as published, then re-pushed.
			b := &batch{}
			b.add(e, traceparent.FromContext(ctx))
			if _, err := tx.Exec(ctx, repushReinsertSQL, b.args()...); err != nil {
				return mapErr(err)
			}
			if _, err := tx.Exec(ctx, repushReinsertDispatchSQL, e.AggregateType, e.AggregateID, e.Version); err != nil {
				return fmt.Errorf("outbox: re-push %s: %w", e.ID, err)
			}
			aggType, aggID, version = e.AggregateType, e.AggregateID, e.Version
		case err != nil:
			return fmt.Errorf("outbox: re-push %s: %w", e.ID, err)
		case failed != nil && *failed == version:
			// The aggregate FAILED at this event: clear it and flow again.
			if _, err := tx.Exec(ctx, repushTargetSQL, e.ID, target); err != nil {
				return fmt.Errorf("outbox: re-push %s: %w", e.ID, err)
			}
			if _, err := tx.Exec(ctx, repushClearFailedSQL, aggType, aggID); err != nil {
				return fmt.Errorf("outbox: re-push %s: %w", e.ID, err)
			}
			out = Enqueued{ID: e.ID, State: StatePending, Aggregate: Aggregate{aggType, aggID}, Version: version, Target: target}
			return nil
		case cursor == nil || *cursor < version || queued:
			return fmt.Errorf("outbox: re-push %s: %w", e.ID, ErrPending)
		}
		if _, err := tx.Exec(ctx, repushQueueSQL, e.ID, target); err != nil {
			return fmt.Errorf("outbox: re-push %s: %w", e.ID, err)
		}
		out = Enqueued{ID: e.ID, State: StatePending, Aggregate: Aggregate{aggType, aggID}, Version: version, Target: target}
		return nil
	})
	if err != nil {
		return Enqueued{}, err
	}
	return out, nil
}

// Lookup returns the dispatch state of the given event ids; ids not in the
// outbox are absent from the map.
func Lookup(ctx context.Context, db postgres.DBTX, ids ...string) (map[string]Enqueued, error) {
	rows, err := db.Query(ctx, lookupSQL, ids)
	if err != nil {
		return nil, fmt.Errorf("outbox: lookup: %w", err)
	}
	defer rows.Close()
	out := make(map[string]Enqueued, len(ids))
	for rows.Next() {
		var (
			e                            Enqueued
			published, failed, cancelled bool
			publishedAt, deliverAt       *time.Time
		)
		if err := rows.Scan(&e.ID, &e.Aggregate.Type, &e.Aggregate.ID, &e.Version, &e.Topic, &e.TraceID,
			&published, &failed, &publishedAt, &e.Attempts, &e.LastError, &e.Target, &deliverAt, &cancelled); err != nil {
			return nil, fmt.Errorf("outbox: lookup: %w", err)
		}
		if deliverAt != nil {
			e.DeliverAt = deliverAt.UTC()
		}
		switch {
		case cancelled:
			e.State = StateCancelled
		case published:
			e.State = StatePublished
			if publishedAt != nil {
				e.PublishedAt = publishedAt.UTC()
			}
		case failed:
			e.State = StateFailed
		default:
			e.State = StatePending
		}
		out[e.ID] = e
	}
	return out, rows.Err()
}

// batch holds Enqueue's columns as arrays for one unnest insert.
type batch struct {
	id, aggType, aggID, typ            []string
	version                            []int64
	payload                            [][]byte
	occurred                           []time.Time
	topic, source, schema, payloadType []string
	trace, span, parent, corr          []string
	initiator                          []string // JSON: text, not []byte, so pgx's exec mode (behind a pooler) sends it as jsonb, not bytea
	initiatorOf                        []event.Initiator
	expire                             []*time.Time
	target                             []string
	traceparent                        []*string
	deliverAt                          []*time.Time
	sourceVersion                      []*string
}

// add adds e, enqueued under the traceparent tp ("" for none).
func (b *batch) add(e *event.Event, tp string) {
	b.id = append(b.id, e.ID)
	b.aggType = append(b.aggType, e.AggregateType)
	b.aggID = append(b.aggID, e.AggregateID)
	b.typ = append(b.typ, e.Type)
	b.version = append(b.version, e.Version)
	p := e.Payload
	if p == nil {
		p = []byte{}
	}
	b.payload = append(b.payload, p)
	b.occurred = append(b.occurred, e.OccurredAt)
	b.topic = append(b.topic, e.Topic)
	b.source = append(b.source, e.Source)
	b.schema = append(b.schema, e.SchemaVersion)
	b.payloadType = append(b.payloadType, e.PayloadType)
	b.trace = append(b.trace, e.TraceID)
	b.span = append(b.span, e.SpanID)
	b.parent = append(b.parent, e.ParentEventID)
	b.corr = append(b.corr, e.CorrelationID)
	in, _ := json.Marshal(e.Initiator)
	b.initiator = append(b.initiator, string(in))
	b.initiatorOf = append(b.initiatorOf, e.Initiator)
	var exp *time.Time
	if !e.ExpireAt.IsZero() {
		t := e.ExpireAt
		exp = &t
	}
	b.expire = append(b.expire, exp)
	b.target = append(b.target, "")
	var t *string
	if tp != "" {
		t = &tp
	}
	b.traceparent = append(b.traceparent, t)
	var d *time.Time
	if !e.DeliverAt.IsZero() {
		t := e.DeliverAt
		d = &t
	}
	b.deliverAt = append(b.deliverAt, d)
	var sv *string
	if e.SourceVersion != "" {
		v := e.SourceVersion
		sv = &v
	}
	b.sourceVersion = append(b.sourceVersion, sv)
}

func (b *batch) args() []any {
	targets := make([]*string, len(b.target))
	for i := range b.target {
		if b.target[i] != "" {
			targets[i] = &b.target[i]
		}
	}
	return []any{b.id, b.aggType, b.aggID, b.typ, b.version, b.payload, b.occurred,
		b.topic, b.source, b.schema, b.payloadType, b.trace, b.span, b.parent, b.corr, b.initiator, b.expire, targets, b.traceparent, b.deliverAt,
		b.sourceVersion}
}

func mapErr(err error) error {
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Code == "23505" && pg.ConstraintName == "relaybus_outbox_aggregate_version" {
		return fmt.Errorf("outbox: version: the aggregate already has another event with this version (%s): %w", pg.Detail, ErrVersionConflict)
	}
	return fmt.Errorf("outbox: %w", err)
}
