package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relaybus/relaybus/internal/migrate"
	"github.com/relaybus/relaybus/shared/postgres"
)

var (
	cancelFindSQL = query("cancel_find")
	cancelSQL     = query("cancel")
	scheduledSQL  = query("scheduled")
)

// Errors of Cancel. Each is wrapped with the event id and what was found.
var (
	// ErrNotFound means the outbox holds no event with the id.
	ErrNotFound = errors.New("event not in the outbox")
	// ErrNotScheduled means the event has no DeliverAt: only scheduled
	// events can be cancelled.
	ErrNotScheduled = errors.New("event is not scheduled")
	// ErrAlreadyDue means the event's DeliverAt has passed (or it was
	// published): the relay may be publishing it, so it cannot be
	// cancelled any more.
	ErrAlreadyDue = errors.New("event is already due")
	// ErrNotHead means an earlier version of the event's aggregate is
	// still unpublished: a cancel moves the aggregate's cursor past the
	// cancelled version, so only the aggregate's first unpublished version
	// can be cancelled. Cancel the earlier one first, or wait until it is
	// published.
	ErrNotHead = errors.New("an earlier version of the aggregate is unpublished")
)

// CancelOptions say who cancels and why, for the record.
type CancelOptions struct {
	// By names who cancels (an operator's principal, a service); may be
	// empty.
	By string
	// Reason says why; may be empty.
	Reason string
}

// Cancel cancels a scheduled event before it is due: it is never
// published, and its aggregate's cursor moves past its version, so the
// versions after it flow (at once, or at their own deliver_at). Cancel is
// for the aggregate's first unpublished version (ErrNotHead otherwise)
// whose DeliverAt is still ahead by the database's clock (ErrAlreadyDue,
// ErrNotScheduled otherwise); a cancelled event's state is
// StateCancelled, and cancelling it again returns that state without
// error. Consumers never see the cancelled version: one that gates
// strictly on version = last + 1 sees a version gap (docs/producing.md).
//
// db is a pool (Cancel runs its own transaction) or the caller's
// transaction.
func Cancel(ctx context.Context, db postgres.DBTX, id string, o CancelOptions) (Enqueued, error) {
	b, ok := db.(migrate.Beginner)
	if !ok {
		return Enqueued{}, fmt.Errorf("outbox: cancel %s: the database handle cannot begin a transaction", id)
	}
	var out Enqueued
	err := pgx.BeginFunc(ctx, b, func(tx pgx.Tx) error {
		var (
			aggType, aggID string
			version        int64
			deliverAt      *time.Time
			ahead          *bool
			cancelled      bool
			cursor         int64
			head           *int64
		)
		err := tx.QueryRow(ctx, cancelFindSQL, id).Scan(&aggType, &aggID, &version, &deliverAt, &ahead, &cancelled, &cursor, &head)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return fmt.Errorf("outbox: cancel %s: %w", id, ErrNotFound)
		case err != nil:
			return fmt.Errorf("outbox: cancel %s: %w", id, err)
		}
		out = Enqueued{ID: id, Aggregate: Aggregate{aggType, aggID}, Version: version, State: StatePending}
		if deliverAt != nil {
			out.DeliverAt = deliverAt.UTC()
		}
		switch {
		case cancelled:
			out.State = StateCancelled
			return nil
		case deliverAt == nil:
			return fmt.Errorf("outbox: cancel %s: it has no deliverAt: %w", id, ErrNotScheduled)
		case version <= cursor || ahead == nil || !*ahead:
			return fmt.Errorf("outbox: cancel %s: its deliverAt %s has passed: %w", id, out.DeliverAt.Format(time.RFC3339), ErrAlreadyDue)
		case head != nil && *head != version:
			return fmt.Errorf("outbox: cancel %s (version %d): version %d of aggregate %s/%s is unpublished before it: %w",
				id, version, *head, aggType, aggID, ErrNotHead)
		}
		if err := tx.QueryRow(ctx, cancelSQL, id, aggType, aggID, version, deliverAt, o.By, o.Reason).Scan(new(time.Time)); err != nil {
			return fmt.Errorf("outbox: cancel %s: %w", id, err)
		}
		out.State = StateCancelled
		return nil
	})
	if err != nil {
		return Enqueued{}, err
	}
	return out, nil
}

// ScheduledEvent is an unpublished scheduled event, as Scheduled lists it.
type ScheduledEvent struct {
	ID        string
	Aggregate Aggregate
	Version   int64
	Topic     string
	Type      string
	DeliverAt time.Time
	// EnqueuedAt is when the producer's transaction wrote it.
	EnqueuedAt time.Time
	// Due is true once DeliverAt has passed: the relay publishes it next
	// (unless an earlier version of its aggregate still holds it).
	Due bool
}

// ScheduledOptions page through Scheduled.
type ScheduledOptions struct {
	// Limit is the most events returned; zero or less means 100.
	Limit int
	// After, when its ID is not empty, is the last event of the previous
	// page: the listing continues after it (by DeliverAt, then ID).
	After ScheduledEvent
}

// Scheduled lists the outbox's scheduled events that are neither
// published nor cancelled, by DeliverAt then id.
func Scheduled(ctx context.Context, db postgres.DBTX, o ScheduledOptions) ([]ScheduledEvent, error) {
	limit := o.Limit
	if limit <= 0 {
		limit = 100
	}
	var afterAt *time.Time
	if o.After.ID != "" {
		t := o.After.DeliverAt
		afterAt = &t
	}
	rows, err := db.Query(ctx, scheduledSQL, afterAt, o.After.ID, limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: scheduled: %w", err)
	}
	defer rows.Close()
	var out []ScheduledEvent
	for rows.Next() {
		var s ScheduledEvent
		if err := rows.Scan(&s.ID, &s.Aggregate.Type, &s.Aggregate.ID, &s.Version, &s.Topic, &s.Type, &s.DeliverAt, &s.EnqueuedAt, &s.Due); err != nil {
			return nil, fmt.Errorf("outbox: scheduled: %w", err)
		}
		s.DeliverAt, s.EnqueuedAt = s.DeliverAt.UTC(), s.EnqueuedAt.UTC()
		out = append(out, s)
	}
	return out, rows.Err()
}
