// Package projection holds relaybus's built-in consumer handlers that keep
// per-aggregate order even where delivery reorders (Eventarc, replays,
// re-pushes):
//
//   - Latest upserts each aggregate's latest state, taking an event only
//     when its version is newer than the one held (a version gate: late or
//     repeated versions change nothing);
//   - Strict applies every version of an aggregate exactly in order (last
//   - 1), through a resequencer: an event that arrives before its
//     predecessor is parked in the consumer's own database, in the
//     delivery's transaction, and acknowledged; when the missing version is
//     applied, the parked events that are now next are applied in the same
//     transaction, in order. Nothing is redelivered or dead-lettered for
//     arriving early. See [Resequencer] for its tables, the gap timeout and
//     how an operator releases a gap.
//
// Every query is a .sql file under sql/, embedded.
package projection

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/relaybus/relaybus/internal/migrate"
	"github.com/relaybus/relaybus/internal/telemetry"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/postgres"
	"github.com/relaybus/relaybus/shared/topology"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Migrations is the projection tables' migration line.
var Migrations = migrate.MustLoadFS("projection", migrationFS, "migrations")

//go:embed sql/*.sql
var sqlFS embed.FS

func query(name string) string {
	b, err := sqlFS.ReadFile("sql/" + name + ".sql")
	if err != nil {
		panic("projection: no query " + name)
	}
	return string(b)
}

var (
	latestSQL   = query("latest")
	positionSQL = query("position")
	advanceSQL  = query("advance")
	skippedSQL  = query("skipped")
	parkSQL     = query("park")
	parkedSQL   = query("parked")
	unparkSQL   = query("unpark")
	gapsSQL     = query("gaps")
	stallSQL    = query("stall")
	skipSQL     = query("skip")

	latestVersionSQL = query("latestversion")
	strictVersionSQL = query("strictversion")
)

// HeldVersion returns the version consumer's version gate holds for an
// aggregate (0 when it holds none): the latest-state projection's
// (handler "projection") or the strict position's (handler "strict").
// Readers outside the consume path (dlqreplay's dry runs) go through it
// rather than reading the tables. Any other handler is an error: it keeps
// no version gate.
func HeldVersion(ctx context.Context, db postgres.DBTX, handler, consumer, aggregateType, aggregateID string) (int64, error) {
	var q string
	switch handler {
	case topology.HandlerProjection:
		q = latestVersionSQL
	case topology.HandlerStrict:
		q = strictVersionSQL
	default:
		return 0, fmt.Errorf("%w: handler %s", ErrNoVersionGate, handler)
	}
	var v int64
	err := db.QueryRow(ctx, q, consumer, aggregateType, aggregateID).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("projection: held version: %w", err)
	}
	return v, nil
}

// ErrNoVersionGate is HeldVersion's error for a handler that keeps no
// version gate.
var ErrNoVersionGate = errors.New("projection: no version gate")

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
//
// It records the projection's version lag as the consumer sees it (see
// telemetry.RecordProjection): when it applies an event, the versions it
// jumped over (the event's version minus the one held minus 1, 0 in
// order); when it does not, a stale event.
func Latest() consumer.Handler {
	return consumer.HandlerFunc(func(ctx context.Context, c *consumer.Context) error {
		e := c.Event
		// The upsert is the attempt's last statement: it goes out with the
		// COMMIT (one round trip for both).
		args := []any{c.ConsumerID, e.AggregateType, e.AggregateID, e.Version, e.ID, e.Type,
			string(State(e))} // text, not []byte: pgx's exec mode (behind a pooler) would send bytea
		err := c.AtCommit(ctx, latestSQL, args, func(row pgx.Row) error {
			var held int64
			err := row.Scan(&held)
			applied := true
			switch {
			case errors.Is(err, pgx.ErrNoRows):
				applied = false // the projection holds this version or a newer one
			case err != nil:
				return err
			}
			telemetry.RecordProjection(ctx, e.Topic, c.ConsumerID, e.Version, held, applied)
			return nil
		})
		if err != nil {
			return consumer.Transient("database", fmt.Errorf("projection: %w", err))
		}
		return nil
	})
}
