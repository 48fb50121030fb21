// Package outbox is relaybus's transactional outbox in Postgres: a producer
// enqueues events in the same transaction as its business rows, and the relay
// publishes them to Pub/Sub afterwards, in per-aggregate version order.
//
// The table (relaybus_outbox, created by [Migrate]) keeps the company-wide
// minimum columns (id, aggregatetype, aggregateid, event_type, version,
// payload, occurred_at) so that a Debezium outbox router could read it, plus
// the rest of the envelope and the relay's dispatch state.
package outbox

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/migrate"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Migrations is the outbox's migration line.
var Migrations = migrate.MustLoadFS("outbox", migrationFS, "migrations")

// Migrate creates or upgrades the outbox table in db's search_path.
func Migrate(ctx context.Context, db migrate.Beginner) error {
	_, err := Migrations.Apply(ctx, db)
	return err
}

// DBTX is what Enqueue needs of a database handle: a pgx.Tx (the usual case,
// the caller's own transaction), a *pgxpool.Pool or a *pgx.Conn.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// State is where an outbox row is in its dispatch.
type State string

// Dispatch states.
const (
	// StatePending: waiting to be published (or to be retried).
	StatePending State = "pending"
	// StatePublished: Pub/Sub accepted it.
	StatePublished State = "published"
	// StateFailed: publishing failed the maximum number of times; the row is
	// kept for an operator and blocks its aggregate.
	StateFailed State = "failed"
)

// Enqueued reports what Enqueue did with one event.
type Enqueued struct {
	ID string
	// Duplicate is true when the outbox already held an event with this id;
	// nothing was written and the fields below describe the existing row.
	Duplicate   bool
	State       State
	Attempts    int
	PublishedAt time.Time
	LastError   string
}

// ErrVersionConflict means the aggregate already has a different event with
// the same version.
var ErrVersionConflict = errors.New("version conflict")

// Enqueue writes events into the outbox through db, normally the caller's own
// transaction, so they are published if and only if it commits. Each event
// is prepared first (a missing id, occurrence time or trace id is filled in,
// see event.Prepare) and validated against Pub/Sub's hard limits; callers
// that enforce a smaller payload limit validate before. Enqueue is idempotent
// on event id: an id already in the outbox is reported as a duplicate with
// its current state, and nothing is written for it. An event whose aggregate
// already has that version under another id fails with ErrVersionConflict.
func Enqueue(ctx context.Context, db DBTX, events ...*event.Event) ([]Enqueued, error) {
	if len(events) == 0 {
		return nil, nil
	}
	now := time.Now().UTC()
	b := &batch{}
	seen := make(map[string]bool, len(events))
	for i, e := range events {
		if err := e.Prepare(now, event.Limits{MaxPayloadBytes: event.MaxPayloadLimit}); err != nil {
			return nil, fmt.Errorf("outbox: event %d (%s): %w", i, e.ID, err)
		}
		if seen[e.ID] {
			continue
		}
		seen[e.ID] = true
		b.add(e)
	}
	rows, err := db.Query(ctx, insertSQL+` ON CONFLICT (id) DO NOTHING RETURNING id`, b.args()...)
	if err != nil {
		return nil, mapErr(err)
	}
	inserted := make(map[string]bool, len(events))
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return nil, mapErr(err)
		}
		inserted[id] = true
	}
	if err := rows.Err(); err != nil {
		return nil, mapErr(err)
	}
	out := make([]Enqueued, len(events))
	var dups []string
	for i, e := range events {
		out[i] = Enqueued{ID: e.ID, State: StatePending}
		if !inserted[e.ID] {
			out[i].Duplicate = true
			dups = append(dups, e.ID)
		}
	}
	if len(dups) > 0 {
		states, err := lookup(ctx, db, dups)
		if err != nil {
			return nil, err
		}
		for i := range out {
			if out[i].Duplicate {
				st := states[out[i].ID]
				st.Duplicate = true
				out[i] = st
			}
		}
	}
	return out, nil
}

// ErrPending means a re-push found the event still waiting to be published.
var ErrPending = errors.New("event is still pending in the outbox")

// Repush queues an event again, as an operator's re-push does: its row goes
// back to pending with its attempts reset and, when target is not empty,
// addressed to that consumer alone (the relay sets the target_consumer
// attribute that every other consumer's subscription filters out). When
// retention has already deleted the row, it is inserted again from e. A row
// that is still pending is left alone and ErrPending returned.
func Repush(ctx context.Context, db DBTX, e *event.Event, target string) (Enqueued, error) {
	if err := e.Prepare(time.Now().UTC(), event.Limits{MaxPayloadBytes: event.MaxPayloadLimit}); err != nil {
		return Enqueued{}, fmt.Errorf("outbox: re-push %s: %w", e.ID, err)
	}
	b := &batch{}
	b.add(e)
	b.target[0] = target
	var id string
	err := db.QueryRow(ctx, insertSQL+` ON CONFLICT (id) DO UPDATE SET
		published_at = NULL, failed_at = NULL, attempts = 0, next_retry_at = NULL, last_error = NULL,
		lease_owner = NULL, lease_expires_at = NULL, target_consumer = EXCLUDED.target_consumer,
		seq = nextval(pg_get_serial_sequence('relaybus_outbox', 'seq'))
		WHERE relaybus_outbox.published_at IS NOT NULL OR relaybus_outbox.failed_at IS NOT NULL
		RETURNING id`, b.args()...).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return Enqueued{}, fmt.Errorf("outbox: re-push %s: %w", e.ID, ErrPending)
	}
	if err != nil {
		return Enqueued{}, mapErr(err)
	}
	return Enqueued{ID: id, State: StatePending}, nil
}

// Lookup returns the dispatch state of the given event ids; ids not in the
// outbox are absent from the map.
func Lookup(ctx context.Context, db DBTX, ids ...string) (map[string]Enqueued, error) {
	return lookup(ctx, db, ids)
}

func lookup(ctx context.Context, db DBTX, ids []string) (map[string]Enqueued, error) {
	rows, err := db.Query(ctx, `SELECT id, attempts, published_at, failed_at, coalesce(last_error, '')
		FROM relaybus_outbox WHERE id = ANY($1)`, ids)
	if err != nil {
		return nil, fmt.Errorf("outbox: lookup: %w", err)
	}
	defer rows.Close()
	out := make(map[string]Enqueued, len(ids))
	for rows.Next() {
		var (
			e                 Enqueued
			published, failed *time.Time
		)
		if err := rows.Scan(&e.ID, &e.Attempts, &published, &failed, &e.LastError); err != nil {
			return nil, fmt.Errorf("outbox: lookup: %w", err)
		}
		switch {
		case published != nil:
			e.State, e.PublishedAt = StatePublished, *published
		case failed != nil:
			e.State = StateFailed
		default:
			e.State = StatePending
		}
		out[e.ID] = e
	}
	return out, rows.Err()
}

const insertSQL = `INSERT INTO relaybus_outbox (id, aggregatetype, aggregateid, event_type, version, payload, occurred_at,
	topic, source, schema_version, payload_type, trace_id, span_id, parent_event_id, correlation_id, initiator, expire_at, target_consumer)
	SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::bytea[], $7::timestamptz[],
	$8::text[], $9::text[], $10::text[], $11::text[], $12::text[], $13::text[], $14::text[], $15::text[], $16::jsonb[], $17::timestamptz[], $18::text[])`

// batch holds Enqueue's columns as arrays for one unnest insert.
type batch struct {
	id, aggType, aggID, typ            []string
	version                            []int64
	payload                            [][]byte
	occurred                           []time.Time
	topic, source, schema, payloadType []string
	trace, span, parent, corr          []string
	initiator                          [][]byte
	expire                             []*time.Time
	target                             []string
}

func (b *batch) add(e *event.Event) {
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
	b.initiator = append(b.initiator, in)
	var exp *time.Time
	if !e.ExpireAt.IsZero() {
		t := e.ExpireAt
		exp = &t
	}
	b.expire = append(b.expire, exp)
	b.target = append(b.target, "")
}

func (b *batch) args() []any {
	targets := make([]*string, len(b.target))
	for i := range b.target {
		if b.target[i] != "" {
			targets[i] = &b.target[i]
		}
	}
	return []any{b.id, b.aggType, b.aggID, b.typ, b.version, b.payload, b.occurred,
		b.topic, b.source, b.schema, b.payloadType, b.trace, b.span, b.parent, b.corr, b.initiator, b.expire, targets}
}

func mapErr(err error) error {
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Code == "23505" && pg.ConstraintName == "relaybus_outbox_aggregate_version" {
		return fmt.Errorf("outbox: version: the aggregate already has another event with this version (%s): %w", pg.Detail, ErrVersionConflict)
	}
	return fmt.Errorf("outbox: %w", err)
}
