// Package projection holds relaybus's built-in consumer handlers that keep
// per-aggregate order even where delivery reorders (Eventarc, replays,
// re-pushes):
//
//   - Latest upserts each aggregate's latest state, taking an event only
//     when its version is newer than the one held (a version gate: late or
//     repeated versions change nothing);
//   - Strict lets an event through only when its version is the next one
//     (last + 1); otherwise it answers consumer.ErrGap, a transient error,
//     so the message comes back later, after the missing versions.
package projection

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/migrate"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Migrations is the projection tables' migration line.
var Migrations = migrate.MustLoadFS("projection", migrationFS, "migrations")

// Migrate creates or upgrades the projection tables in db's search_path.
func Migrate(ctx context.Context, db migrate.Beginner) error {
	_, err := Migrations.Apply(ctx, db)
	return err
}

// State returns the payload as the projection stores it: JSON as is; any
// other payload as {"payloadType": ..., "dataBase64": ...}.
func State(e *event.Event) []byte {
	if event.IsJSONType(e.PayloadType) && json.Valid(e.Payload) {
		return e.Payload
	}
	b, _ := json.Marshal(map[string]any{"payloadType": e.PayloadType, "dataBase64": e.Payload})
	return b
}

// Latest is the generic projection: it upserts the aggregate's state keyed
// by (consumer, aggregate type, aggregate id) when the event's version is
// newer than the stored one.
func Latest() consumer.Handler {
	return consumer.HandlerFunc(func(ctx context.Context, c *consumer.Context) error {
		e := c.Event
		_, err := c.Tx.Exec(ctx, `INSERT INTO relaybus_projection
			(consumer_id, aggregate_type, aggregate_id, version, event_id, event_type, state)
			VALUES ($1, $2, $3, $4, $5, $6, $7)
			ON CONFLICT (consumer_id, aggregate_type, aggregate_id) DO UPDATE
			SET version = EXCLUDED.version, event_id = EXCLUDED.event_id, event_type = EXCLUDED.event_type,
			    state = EXCLUDED.state, updated_at = now()
			WHERE relaybus_projection.version < EXCLUDED.version`,
			c.ConsumerID, e.AggregateType, e.AggregateID, e.Version, e.ID, e.Type, State(e))
		if err != nil {
			return consumer.Transient("database", fmt.Errorf("projection: %w", err))
		}
		return nil
	})
}

// Strict runs next only for the aggregate's next version (last applied +
// 1, or 1 for a new aggregate) and moves the position in the same
// transaction. A later version answers consumer.ErrGap (redelivered
// later); an earlier one was applied already and is acknowledged with no
// effect.
func Strict(next consumer.Handler) consumer.Handler {
	return consumer.HandlerFunc(func(ctx context.Context, c *consumer.Context) error {
		e := c.Event
		var last int64
		err := c.Tx.QueryRow(ctx, `SELECT version FROM relaybus_strict_position
			WHERE consumer_id = $1 AND aggregate_type = $2 AND aggregate_id = $3 FOR UPDATE`,
			c.ConsumerID, e.AggregateType, e.AggregateID).Scan(&last)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return consumer.Transient("database", fmt.Errorf("strict position: %w", err))
		}
		switch {
		case e.Version <= last:
			return nil // applied before, under another event id
		case e.Version > last+1:
			return fmt.Errorf("%w: %s/%s holds version %d, got %d", consumer.ErrGap, e.AggregateType, e.AggregateID, last, e.Version)
		}
		if _, err := c.Tx.Exec(ctx, `INSERT INTO relaybus_strict_position (consumer_id, aggregate_type, aggregate_id, version, event_id)
			VALUES ($1, $2, $3, $4, $5)
			ON CONFLICT (consumer_id, aggregate_type, aggregate_id) DO UPDATE
			SET version = EXCLUDED.version, event_id = EXCLUDED.event_id, updated_at = now()`,
			c.ConsumerID, e.AggregateType, e.AggregateID, e.Version, e.ID); err != nil {
			return consumer.Transient("database", fmt.Errorf("strict position: %w", err))
		}
		if next == nil {
			return nil
		}
		return next.Handle(ctx, c)
	})
}
