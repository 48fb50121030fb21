package ledger

import (
	"context"
	"time"

	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/registry"
)

// The interfaces the other functions declare (notes/TEAM.md contracts),
// checked at compile time against what this package provides.
type (
	relayLedger interface {
		RecordSent(ctx context.Context, sends []Sent) error
		RecordPublishFailure(ctx context.Context, e *event.Event, attempts int, lastError string, final bool, at time.Time) error
	}
	consumeLedger interface {
		RecordAttempts(ctx context.Context, as []Attempt) error
	}
	repushHook interface {
		BeginRepush(ctx context.Context, eventID string, consumer string, check func(Event) error, at time.Time) (Event, error)
	}
)

var (
	_ relayLedger       = (*Store)(nil)
	_ consumeLedger     = (*Recorder)(nil)
	_ repushHook        = (*Store)(nil)
	_ registry.Registry = (*Store)(nil)
)
