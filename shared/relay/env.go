package relay

import (
	"context"
	"time"

	"github.com/relaybus/relaybus/internal/telemetry"
	"github.com/relaybus/relaybus/shared/outbox"
)

// Config is the relay's tuning as the functions that run a relay (the
// relay function, publish's fast path) declare it in their configuration
// (github.com/sethvargo/go-envconfig tags; the functions' loader reads
// them, the engine reads no environment). Its ledger budget is the
// functions' LEDGER_BUDGET.
type Config struct {
	// TimeBudget bounds one scheduled drain (RELAY_TIME_BUDGET, 45s); keep
	// it under the Scheduler job's attempt deadline.
	TimeBudget time.Duration `env:"RELAY_TIME_BUDGET, default=45s"`
	// BatchSize is the most rows one claim takes (RELAY_BATCH_SIZE, 1000).
	BatchSize int `env:"RELAY_BATCH_SIZE, default=1000"`
	// Aggregates is the most aggregates one claim leases (RELAY_AGGREGATES, 1000).
	Aggregates int `env:"RELAY_AGGREGATES, default=1000"`
	// RunLimit is the most rows of one aggregate per claim (RELAY_RUN_LIMIT, 500).
	RunLimit int `env:"RELAY_RUN_LIMIT, default=500"`
	// Concurrency is how many claim/publish/settle workers a drain runs
	// (RELAY_CONCURRENCY, 4).
	Concurrency int `env:"RELAY_CONCURRENCY, default=4"`
	// Lease is how long a claim holds its aggregates (RELAY_LEASE, 20s):
	// long enough for one claim's publishes, short enough that a relay that
	// died leaves its aggregates waiting only that long.
	Lease time.Duration `env:"RELAY_LEASE, default=20s"`
	// MaxAttempts failed publishes make an aggregate FAILED (RELAY_MAX_ATTEMPTS, 5).
	MaxAttempts int `env:"RELAY_MAX_ATTEMPTS, default=5"`
	// BackoffBase and BackoffMax shape the retry delays (RELAY_BACKOFF_BASE
	// 10s, RELAY_BACKOFF_MAX 10m).
	BackoffBase time.Duration `env:"RELAY_BACKOFF_BASE, default=10s"`
	BackoffMax  time.Duration `env:"RELAY_BACKOFF_MAX, default=10m"`
	// Retention is how long published rows are kept (OUTBOX_RETENTION, 24h).
	Retention time.Duration `env:"OUTBOX_RETENTION, default=24h"`
	// HealDelay is how long the live ledger recorder has before the healing
	// step records a send (RELAY_HEAL_DELAY, 30s).
	HealDelay time.Duration `env:"RELAY_HEAL_DELAY, default=30s"`
}

// Options returns the tuning part of a relay's Options; the caller adds
// the clients (DB, Publisher, Topology, Ledger, Logger) and the ledger
// budget.
func (c Config) Options() Options {
	return Options{BatchSize: c.BatchSize, Aggregates: c.Aggregates, RunLimit: c.RunLimit, Concurrency: c.Concurrency,
		Lease: c.Lease, MaxAttempts: c.MaxAttempts, BackoffBase: c.BackoffBase, BackoffMax: c.BackoffMax,
		Retention: c.Retention, HealDelay: c.HealDelay}
}

// Backlog reads db's outbox backlog as the telemetry gauges report it
// (outbox.Count and outbox.Oldest).
func Backlog(ctx context.Context, db DB) (telemetry.OutboxBacklog, error) {
	c, err := outbox.Count(ctx, db)
	if err != nil {
		return telemetry.OutboxBacklog{}, err
	}
	age, err := outbox.Oldest(ctx, db)
	if err != nil {
		return telemetry.OutboxBacklog{}, err
	}
	return telemetry.OutboxBacklog{OldestAge: age, Pending: c.Pending, Blocked: c.Blocked, Failed: c.Failed}, nil
}
