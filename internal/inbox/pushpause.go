package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relaybus/relaybus/shared/postgres"
)

// Who paused an ordered push consumer (migration 008): on Pub/Sub its pause
// is its subscription's push endpoint detached, by an operator (relaybus
// consumers pause) or by the forward consumer's circuit breaker while the
// target is down. The record says which, in the consumer's database, so
// that consume's probe re-attaches only what its breaker detached: an
// operator's pause is lifted by an operator alone, and an operator's
// pause of a consumer the breaker paused takes the pause over. A resume
// in progress holds the record's row lock (ResumeBreakerPause), so an
// operator's pause that comes meanwhile waits for it and then detaches
// again.

// Who paused a push consumer (PushPause.By).
const (
	PausedByBreaker  = "breaker"
	PausedByOperator = "operator"
)

var (
	pushPauseBreakerSQL  = query("pushpausebreaker")
	pushPauseOperatorSQL = query("pushpauseoperator")
	pushPauseClearSQL    = query("pushpauseclear")
	pushPauseStateSQL    = query("pushpausestate")
	pushPauseLockSQL     = query("pushpauselock")
	pushPauseProbedSQL   = query("pushpauseprobed")
)

// PushPause is the record of a push consumer's pause.
type PushPause struct {
	Subscription string
	ConsumerID   string
	// By is PausedByBreaker or PausedByOperator; Who names the operator.
	By, Who string
	// Endpoint, ServiceAccount and Audience are the push configuration the
	// breaker detached, which its resume sets back.
	Endpoint, ServiceAccount, Audience string
	// Reason is what the breaker's last call, or its last probe, found.
	Reason string
	// PausedAt is when the pause began; ProbeAfter is when the breaker's
	// next probe may go (its cool-down); FailedProbes counts the probes
	// that found the target still down.
	PausedAt, ProbeAfter time.Time
	FailedProbes         int
}

// PauseByBreaker records the breaker's pause of subscription, with the
// push configuration it is about to detach, unless a pause is recorded
// already (the breaker's, or an operator's): it reports whether it
// recorded one, and only then may the caller detach the endpoint.
func PauseByBreaker(ctx context.Context, db postgres.DBTX, p PushPause) (bool, error) {
	tag, err := db.Exec(ctx, pushPauseBreakerSQL, p.Subscription, p.ConsumerID, p.Endpoint, p.ServiceAccount, p.Audience, p.Reason, p.ProbeAfter)
	if err != nil {
		return false, fmt.Errorf("inbox: record the breaker's pause of %s: %w", p.Subscription, err)
	}
	return tag.RowsAffected() > 0, nil
}

// PauseByOperator records an operator's pause of subscription (before its
// endpoint is detached), taking over a pause the breaker recorded.
func PauseByOperator(ctx context.Context, db postgres.DBTX, subscription, consumerID, who string) error {
	if _, err := db.Exec(ctx, pushPauseOperatorSQL, subscription, consumerID, who); err != nil {
		return fmt.Errorf("inbox: record the pause of %s by %s: %w", subscription, who, err)
	}
	return nil
}

// ClearPushPause deletes the record of subscription's pause: any (by "")
// after an operator's resume, or only the breaker's (by PausedByBreaker)
// when its detach failed.
func ClearPushPause(ctx context.Context, db postgres.DBTX, subscription, by string) error {
	if _, err := db.Exec(ctx, pushPauseClearSQL, subscription, by); err != nil {
		return fmt.Errorf("inbox: clear the pause record of %s: %w", subscription, err)
	}
	return nil
}

// PushPauseOf returns the record of subscription's pause; ok is false when
// none is recorded.
func PushPauseOf(ctx context.Context, db postgres.DBTX, subscription string) (p PushPause, ok bool, err error) {
	p, err = scanPushPause(db.QueryRow(ctx, pushPauseStateSQL, subscription), subscription)
	if errors.Is(err, pgx.ErrNoRows) {
		return PushPause{}, false, nil
	}
	if err != nil {
		return PushPause{}, false, fmt.Errorf("inbox: pause record of %s: %w", subscription, err)
	}
	return p, true, nil
}

func scanPushPause(row pgx.Row, subscription string) (PushPause, error) {
	p := PushPause{Subscription: subscription}
	err := row.Scan(&p.ConsumerID, &p.By, &p.Who, &p.Endpoint, &p.ServiceAccount, &p.Audience, &p.Reason, &p.PausedAt, &p.ProbeAfter, &p.FailedProbes)
	return p, err
}

// BreakerProbeFailed records a probe that found the target still down:
// the next may go at next. It changes nothing unless the pause is still
// the breaker's.
func BreakerProbeFailed(ctx context.Context, db postgres.DBTX, subscription string, next time.Time, reason string) error {
	if _, err := db.Exec(ctx, pushPauseProbedSQL, subscription, next, reason); err != nil {
		return fmt.Errorf("inbox: record a probe of %s: %w", subscription, err)
	}
	return nil
}

// ResumeBreakerPause lifts the breaker's pause of subscription: within one
// transaction that holds the record's row lock it calls resume (which
// re-attaches the endpoint) and deletes the record. It does nothing, and
// reports false, when no pause is recorded or the pause is an operator's.
// An operator's pause that comes meanwhile waits for the lock, then
// detaches the endpoint again.
func ResumeBreakerPause(ctx context.Context, db postgres.Beginner, subscription string, resume func(context.Context, PushPause) error) (resumed bool, err error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("inbox: resume %s: %w", subscription, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	p, err := scanPushPause(tx.QueryRow(ctx, pushPauseLockSQL, subscription), subscription)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("inbox: resume %s: %w", subscription, err)
	}
	if p.By != PausedByBreaker {
		return false, nil
	}
	if err := resume(ctx, p); err != nil {
		return false, err
	}
	if _, err := tx.Exec(ctx, pushPauseClearSQL, subscription, PausedByBreaker); err != nil {
		return false, fmt.Errorf("inbox: resume %s: %w", subscription, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("inbox: resume %s: %w", subscription, err)
	}
	return true, nil
}
