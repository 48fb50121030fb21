package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relaybus/relaybus/shared/postgres"
)

// A circuit breaker's pause by the consumer's own flag (migration 009): a
// forward consumer delivered by Eventarc cannot detach its delivery (the
// trigger owns its subscription), and every answer but an acknowledgement
// spends a delivery attempt there. So when its breaker opens, consume sets
// the consumer's pause row marked as the breaker's: deliveries are kept
// (Hold) and acknowledged, no attempt spent, until consume's probe finds
// the target up, lifts the breaker's row (ClearFlagBreakerPause) and
// publishes the kept deliveries again (PublishHeld). The rules are the
// push-pause record's: the probe lifts only a breaker's row; an operator's
// pause takes a breaker's row over (SetPaused); an operator's resume lifts
// either.

var (
	flagBreakerSQL = query("flagbreaker")
	flagStateSQL   = query("flagstate")
	flagProbedSQL  = query("flagprobed")
	flagClearSQL   = query("flagclear")
)

// FlagPause is the row of a consumer's pause by its own flag.
type FlagPause struct {
	ConsumerID, Topic string
	// By is PausedByBreaker or PausedByOperator; Who names who paused it
	// ("circuit breaker" for the breaker).
	By, Who string
	// Reason is what the breaker's last call, or its last probe, found.
	Reason string
	// PausedAt is when the pause began; ProbeAfter is when the breaker's
	// next probe may go (its cool-down); FailedProbes counts the probes
	// that found the target still down.
	PausedAt, ProbeAfter time.Time
	FailedProbes         int
}

// PauseFlagByBreaker pauses consumerID on topic by its flag for its
// circuit breaker, with the reason and the time its first probe may go,
// unless a pause stands already (the breaker's, or an operator's): it
// reports whether it set one.
func PauseFlagByBreaker(ctx context.Context, db postgres.DBTX, consumerID, topic, reason string, probeAfter time.Time) (bool, error) {
	tag, err := db.Exec(ctx, flagBreakerSQL, consumerID, topic, reason, probeAfter)
	if err != nil {
		return false, fmt.Errorf("inbox: the breaker's pause of %s on %s: %w", consumerID, topic, err)
	}
	return tag.RowsAffected() > 0, nil
}

// FlagPauseOf returns consumerID's pause row on topic; ok is false when it
// is not paused.
func FlagPauseOf(ctx context.Context, db postgres.DBTX, consumerID, topic string) (p FlagPause, ok bool, err error) {
	p = FlagPause{ConsumerID: consumerID, Topic: topic}
	var breaker bool
	err = db.QueryRow(ctx, flagStateSQL, consumerID, topic).Scan(&breaker, &p.Who, &p.Reason, &p.PausedAt, &p.ProbeAfter, &p.FailedProbes)
	if errors.Is(err, pgx.ErrNoRows) {
		return FlagPause{}, false, nil
	}
	if err != nil {
		return FlagPause{}, false, fmt.Errorf("inbox: pause of %s on %s: %w", consumerID, topic, err)
	}
	p.By = PausedByOperator
	if breaker {
		p.By = PausedByBreaker
	}
	return p, true, nil
}

// FlagBreakerProbeFailed records a probe that found the target still
// down: the next may go at next. It changes nothing unless the pause is
// still the breaker's.
func FlagBreakerProbeFailed(ctx context.Context, db postgres.DBTX, consumerID, topic string, next time.Time, reason string) error {
	if _, err := db.Exec(ctx, flagProbedSQL, consumerID, topic, next, reason); err != nil {
		return fmt.Errorf("inbox: record a probe of %s on %s: %w", consumerID, topic, err)
	}
	return nil
}

// ClearFlagBreakerPause lifts the breaker's pause of consumerID on topic
// and reports whether it did: false when no pause stands or it is an
// operator's. The caller then publishes the kept deliveries (PublishHeld).
func ClearFlagBreakerPause(ctx context.Context, db postgres.DBTX, consumerID, topic string) (bool, error) {
	tag, err := db.Exec(ctx, flagClearSQL, consumerID, topic)
	if err != nil {
		return false, fmt.Errorf("inbox: resume %s on %s: %w", consumerID, topic, err)
	}
	return tag.RowsAffected() > 0, nil
}
