package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/relaybus/relaybus/internal/logging"
	"github.com/relaybus/relaybus/internal/traceparent"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/postgres"
)

// StateSkipped is the state a Producer reports for an event it did not
// write because its topic is unknown or has no enabled consumer
// (an event nobody would consume is not sent; docs/producing.md): nothing was written, the caller was not
// failed. It is the publish function's SKIPPED status.
const StateSkipped State = "SKIPPED"

// Contract is the event contract every send path checks before it writes
// (internal/contract implements it from the topology): the payload against
// its topic's schema for its schemaVersion, and whether anyone consumes the
// topic.
type Contract interface {
	// Check returns ("", nil) to write e; a non-empty reason to skip it;
	// or an error that refuses the whole call, nothing written: a payload
	// that breaks its schema (a *schema.Error, which matches
	// event.ErrInvalid), or a registry that cannot answer.
	Check(ctx context.Context, e *event.Event) (skip string, err error)
}

// Producer enqueues events after checking them against the event contract.
// Go producers and handlers' Emit use it; Enqueue alone checks nothing
// beyond event.Prepare.
type Producer struct {
	// Contract checks each event; required.
	Contract Contract
	// Logger receives an ERROR for each skipped event (logging.Discard when
	// nil).
	Logger *slog.Logger
	// SourceVersion is the producer's own version (its release, build or
	// revision), set on events that name none; empty sets none.
	SourceVersion string
}

// Enqueue checks every event against the contract, then writes the ones to
// write as Enqueue does, through db (normally the caller's transaction).
// A payload that breaks its schema or names a version its topic does not
// declare fails the call (errors.As a *schema.Error; errors.Is
// event.ErrInvalid) and nothing is written. An event whose topic is unknown
// or has no enabled consumer is not written: it is logged at ERROR and its
// result has State StateSkipped and the reason; the call does not fail, so
// the caller's transaction goes on. Results are in the order of events.
func (p *Producer) Enqueue(ctx context.Context, db postgres.DBTX, events ...*event.Event) ([]Enqueued, error) {
	if p == nil || p.Contract == nil {
		return nil, fmt.Errorf("outbox: Producer.Contract is required")
	}
	now := time.Now().UTC()
	tp := traceparent.FromContext(ctx)
	out := make([]Enqueued, len(events))
	var write []*event.Event
	var writeAt []int
	for i, e := range events {
		if e.SourceVersion == "" {
			e.SourceVersion = p.SourceVersion
		}
		// As Enqueue does: the span's trace first, then ids and defaults.
		if e.TraceID == "" && tp != "" {
			e.TraceID = tp[3:35]
		}
		if err := e.Prepare(now, event.Limits{MaxPayloadBytes: event.MaxClaimCheckPayload, ClaimCheck: true}); err != nil {
			return nil, fmt.Errorf("outbox: event %d (%s): %w", i, e.ID, err)
		}
		skip, err := p.Contract.Check(ctx, e)
		if err != nil {
			return nil, fmt.Errorf("outbox: event %d (%s): %w", i, e.ID, err)
		}
		if skip != "" {
			out[i] = Enqueued{ID: e.ID, State: StateSkipped, Reason: skip, Aggregate: Aggregate{e.AggregateType, e.AggregateID},
				Version: e.Version, Topic: e.Topic, TraceID: e.TraceID}
			continue
		}
		write = append(write, e)
		writeAt = append(writeAt, i)
	}
	log := p.Logger
	if log == nil {
		log = logging.Discard()
	}
	for i, e := range events {
		if out[i].State == StateSkipped {
			log.ErrorContext(ctx, "outbox: event SKIPPED, nothing written", append(logging.Event(e),
				slog.String("topic", e.Topic), slog.String("reason", out[i].Reason))...)
		}
	}
	if len(write) == 0 {
		return out, nil
	}
	enq, err := Enqueue(ctx, db, write...)
	if err != nil {
		return nil, err
	}
	for k, q := range enq {
		out[writeAt[k]] = q
	}
	return out, nil
}
