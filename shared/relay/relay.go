// Package relay drains the transactional outbox to Pub/Sub: it claims rows
// (outbox.Claim: per-aggregate heads, FOR UPDATE SKIP LOCKED, leases),
// publishes them with the aggregate id as ordering key, marks what Pub/Sub
// acknowledged, and schedules retries with capped exponential backoff for
// what it refused. After MaxAttempts failures a row is FAILED: kept, logged
// at ERROR and counted, blocking only its own aggregate until an operator
// re-pushes it.
//
// Several relays may run at once (Cloud Scheduler overlap, manual kicks,
// publish's fast path through PublishNow): a claim takes an aggregate only
// through its head row, and the head moves only when Pub/Sub acknowledged
// it, so version n+1 of an aggregate never reaches Pub/Sub before version n.
// A relay that dies mid-batch leaves leased rows; the lease expires and
// another relay publishes them (at least once: Pub/Sub may then hold a
// message twice, which the consumers' inboxes absorb).
package relay

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/instance"
	"github.com/relaybus/relaybus/shared/ledger"
	"github.com/relaybus/relaybus/shared/logging"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/topology"
	"github.com/relaybus/relaybus/shared/transport"
)

// Defaults of Options (outbox-streamingpull "OUTBOX配置").
const (
	DefaultBatchSize   = 500
	DefaultLease       = 2 * time.Minute
	DefaultMaxAttempts = 5
	DefaultBackoffBase = 10 * time.Second
	DefaultBackoffMax  = 10 * time.Minute
	DefaultRetention   = 24 * time.Hour
	DefaultConcurrency = 1
	// purgeBatch bounds one retention delete.
	purgeBatch = 5000
)

// DB is what the relay needs of Postgres (a *pgxpool.Pool).
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Publisher is what the relay needs of Pub/Sub (a *transport.Client, whose
// publishers keep message ordering on).
type Publisher interface {
	// PublishAsync queues a message; a failure pauses its ordering key
	// until Resume.
	PublishAsync(ctx context.Context, topic string, m event.Message) transport.Result
	// Resume lets an ordering key publish again after a failure.
	Resume(topic, orderingKey string)
}

// Ledger records sends in the event ledger (shared/ledger's Store).
type Ledger interface {
	// RecordSent creates each event's ledger document with status SENT. It
	// is called just before the batch goes to Pub/Sub. Idempotent.
	RecordSent(ctx context.Context, events []*event.Event, at time.Time) error
	// RecordPublishFailure records a failed publish: PENDING while a retry
	// is scheduled, FAILED when final.
	RecordPublishFailure(ctx context.Context, e *event.Event, attempts int, lastError string, final bool, at time.Time) error
}

// Options configure a Relay. DB and Publisher are required.
type Options struct {
	DB        DB
	Publisher Publisher
	// Topology gives each topic's payload encoding (JSON when nil or when
	// the topic is not declared).
	Topology *topology.Topology
	// Ledger, when set, records sends and publish failures.
	Ledger Ledger
	// BatchSize is the most rows one claim takes (DefaultBatchSize).
	BatchSize int
	// Lease is how long a claim holds its rows (DefaultLease).
	Lease time.Duration
	// MaxAttempts is how many failed publishes make a row FAILED
	// (DefaultMaxAttempts).
	MaxAttempts int
	// BackoffBase and BackoffMax: the n-th failure retries after
	// BackoffBase·2^(n-1), at most BackoffMax (DefaultBackoffBase, DefaultBackoffMax).
	BackoffBase, BackoffMax time.Duration
	// Retention is how long published rows are kept (DefaultRetention);
	// negative keeps them forever.
	Retention time.Duration
	// Concurrency is how many claim/publish/mark loops one Drain runs
	// (DefaultConcurrency).
	Concurrency int
	// Owner names this relay in leases (random when empty).
	Owner string
	// Logger receives the structured logs (logging.Discard when nil).
	Logger *slog.Logger
}

// Relay drains the outbox. It is safe for concurrent use.
type Relay struct {
	o   Options
	log *slog.Logger
}

// New returns a relay over o.
func New(o Options) (*Relay, error) {
	if o.DB == nil || o.Publisher == nil {
		return nil, errors.New("relay: Options.DB and Options.Publisher are required")
	}
	if o.BatchSize <= 0 {
		o.BatchSize = DefaultBatchSize
	}
	if o.Lease <= 0 {
		o.Lease = DefaultLease
	}
	if o.MaxAttempts <= 0 {
		o.MaxAttempts = DefaultMaxAttempts
	}
	if o.BackoffBase <= 0 {
		o.BackoffBase = DefaultBackoffBase
	}
	if o.BackoffMax <= 0 {
		o.BackoffMax = DefaultBackoffMax
	}
	if o.Retention == 0 {
		o.Retention = DefaultRetention
	}
	if o.Concurrency <= 0 {
		o.Concurrency = DefaultConcurrency
	}
	if o.Owner == "" {
		b := make([]byte, 6)
		_, _ = rand.Read(b)
		o.Owner = "relay-" + hex.EncodeToString(b)
	}
	if o.Logger == nil {
		o.Logger = logging.Discard()
	}
	return &Relay{o: o, log: o.Logger}, nil
}

// Backoff returns the delay before retry after the n-th failure (n ≥ 1):
// base·2^(n-1), capped at max.
func Backoff(base, max time.Duration, n int) time.Duration {
	d := base
	for i := 1; i < n && d < max; i++ {
		d *= 2
	}
	return min(d, max)
}

// Summary is what one Drain did.
type Summary struct {
	// Claimed rows were leased by this drain.
	Claimed int `json:"claimed"`
	// Published rows Pub/Sub acknowledged.
	Published int `json:"published"`
	// Retried rows failed and have a retry scheduled.
	Retried int `json:"retried"`
	// Failed rows reached MaxAttempts and are FAILED.
	Failed int `json:"failed"`
	// Remaining rows are still pending (including not yet due retries).
	Remaining int `json:"remaining"`
	// FailedTotal is every FAILED row waiting for an operator.
	FailedTotal int `json:"failed_total"`
	// Purged published rows were deleted by retention.
	Purged int `json:"purged"`
	// LedgerHealed sends were recorded again in the ledger.
	LedgerHealed int `json:"ledger_healed"`
	// DurationMS is how long the drain took.
	DurationMS int64 `json:"duration_ms"`
}

func (s *Summary) add(b batchResult) {
	s.Claimed += b.claimed
	s.Published += b.published
	s.Retried += b.retried
	s.Failed += b.failed
}

// Drain publishes until the outbox has nothing due or budget runs out, then
// records sends the ledger missed, applies retention and counts what is
// left. An error means the drain stopped early; the summary says what it did.
func (r *Relay) Drain(ctx context.Context, budget time.Duration) (Summary, error) {
	start := time.Now()
	var sum Summary
	healed, err := r.healLedger(ctx)
	sum.LedgerHealed = healed
	if err != nil {
		r.log.WarnContext(ctx, "relay: ledger healing failed; the next drain tries again", "error", err.Error())
	}
	deadline := start.Add(budget)
	var (
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
	)
	for range r.o.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil && time.Now().Before(deadline) {
				b, err := r.batch(ctx, outbox.ClaimOptions{})
				mu.Lock()
				sum.add(b)
				if err != nil && firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
				if err != nil || b.claimed == 0 {
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr == nil && r.o.Retention > 0 {
		for time.Now().Before(deadline) {
			n, err := outbox.Purge(ctx, r.o.DB, time.Now().Add(-r.o.Retention), purgeBatch)
			sum.Purged += n
			if err != nil {
				firstErr = err
				break
			}
			if n < purgeBatch {
				break
			}
		}
	}
	if c, err := outbox.Count(ctx, r.o.DB); err == nil {
		sum.Remaining, sum.FailedTotal = c.Pending, c.Failed
	} else if firstErr == nil {
		firstErr = err
	}
	sum.DurationMS = time.Since(start).Milliseconds()
	level := slog.LevelInfo
	if firstErr != nil {
		level = slog.LevelError
	}
	r.log.Log(ctx, level, "relay: drain", "claimed", sum.Claimed, "published", sum.Published, "retried", sum.Retried,
		"failed", sum.Failed, "remaining", sum.Remaining, "failed_total", sum.FailedTotal, "purged", sum.Purged,
		"duration_ms", sum.DurationMS, "error", errString(firstErr))
	return sum, firstErr
}

// PublishNow publishes the given outbox rows at once through the same
// claim/publish/mark code Drain uses: it claims their aggregates' heads
// and the runs behind them up to each given row, if no other relay holds
// them, and returns each id's state afterwards (published, pending when it
// could not, failed). Ids not in the outbox are absent from the map.
func (r *Relay) PublishNow(ctx context.Context, ids ...string) (map[string]outbox.State, error) {
	if len(ids) == 0 {
		return map[string]outbox.State{}, nil
	}
	rows, err := r.o.DB.Query(ctx, `SELECT aggregatetype, aggregateid, max(version) FROM relaybus_outbox
		WHERE id = ANY($1) AND published_at IS NULL GROUP BY 1, 2`, ids)
	if err != nil {
		return nil, fmt.Errorf("relay: publish now: %w", err)
	}
	o := outbox.ClaimOptions{Upto: map[[2]string]int64{}}
	for rows.Next() {
		var k [2]string
		var v int64
		if err := rows.Scan(&k[0], &k[1], &v); err != nil {
			rows.Close()
			return nil, fmt.Errorf("relay: publish now: %w", err)
		}
		o.Aggregates = append(o.Aggregates, k)
		o.Upto[k] = v
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("relay: publish now: %w", err)
	}
	if len(o.Aggregates) > 0 {
		if _, err := r.batch(ctx, o); err != nil {
			return nil, err
		}
	}
	found, err := outbox.Lookup(ctx, r.o.DB, ids...)
	if err != nil {
		return nil, err
	}
	out := make(map[string]outbox.State, len(found))
	for id, e := range found {
		out[id] = e.State
	}
	return out, nil
}

type batchResult struct{ claimed, published, retried, failed int }

// pending is one claimed row on its way to Pub/Sub.
type pending struct {
	row    outbox.Row
	result transport.Result
	err    error
}

// batch claims, publishes and marks one batch.
func (r *Relay) batch(ctx context.Context, co outbox.ClaimOptions) (batchResult, error) {
	co.Owner, co.Lease = r.o.Owner, r.o.Lease
	if co.Limit == 0 {
		co.Limit = r.o.BatchSize
	}
	runs, err := outbox.Claim(ctx, r.o.DB, co)
	if err != nil {
		return batchResult{}, err
	}
	var res batchResult
	if len(runs) == 0 {
		return res, nil
	}
	var sent []*event.Event
	for _, run := range runs {
		res.claimed += len(run)
		for i := range run {
			sent = append(sent, &run[i].Event)
		}
	}
	now := time.Now().UTC()
	ledgerBehind := false
	if r.o.Ledger != nil {
		if err := r.o.Ledger.RecordSent(ctx, sent, now); err != nil {
			ledgerBehind = true
			r.log.WarnContext(ctx, "relay: the ledger did not record the send; publishing anyway, a later drain records it", "events", len(sent), "error", err.Error())
		}
	}
	// Hand everything to Pub/Sub first, then wait: the publisher batches
	// per ordering key and keeps each key's order.
	all := make([][]pending, len(runs))
	for i, run := range runs {
		all[i] = make([]pending, len(run))
		stop := false
		for j, row := range run {
			p := &all[i][j]
			p.row = row
			if stop {
				continue // behind a row that cannot be encoded: not sent
			}
			msg, err := r.encode(&p.row)
			if err != nil {
				p.err, stop = err, true
				continue
			}
			p.result = r.o.Publisher.PublishAsync(ctx, row.Event.Topic, msg)
		}
	}
	// The marks must land even when ctx ends now: they record what Pub/Sub
	// already has.
	markCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	var published []string
	for _, run := range all {
		for j := range run {
			p := &run[j]
			if p.err == nil && p.result != nil {
				_, p.err = p.result.Get(markCtx)
			}
			if p.err == nil {
				published = append(published, p.row.Event.ID)
				continue
			}
			// The first failure of the run: it is retried or FAILED; the
			// rows behind it go back untouched (their publishes were refused
			// as paused, or they never started).
			final, err := r.failed(markCtx, p)
			if err != nil {
				return res, err
			}
			if final {
				res.failed++
			} else {
				res.retried++
			}
			var rest []string
			for k := j + 1; k < len(run); k++ {
				if run[k].err == nil && run[k].result != nil {
					_, _ = run[k].result.Get(markCtx) // let each queued publish finish
				}
				rest = append(rest, run[k].row.Event.ID)
			}
			if err := outbox.Release(markCtx, r.o.DB, r.o.Owner, rest); err != nil {
				return res, err
			}
			r.o.Publisher.Resume(p.row.Event.Topic, p.row.Event.AggregateID)
			break
		}
	}
	if err := outbox.Published(markCtx, r.o.DB, published, ledgerBehind); err != nil {
		return res, err
	}
	res.published = len(published)
	return res, nil
}

// failed records one failed publish and reports whether it was the last.
func (r *Relay) failed(ctx context.Context, p *pending) (bool, error) {
	e := &p.row.Event
	n := p.row.Attempts + 1
	final := n >= r.o.MaxAttempts
	var terr *event.FieldError
	if errors.As(p.err, &terr) {
		final = true // an event Pub/Sub can never take does not get better
	}
	msg := p.err.Error()
	retryAt := time.Now().Add(Backoff(r.o.BackoffBase, r.o.BackoffMax, n))
	if err := outbox.Retry(ctx, r.o.DB, e.ID, msg, retryAt, final); err != nil {
		return final, err
	}
	attrs := append(logging.Event(e), "attempts", n, "error", msg)
	if final {
		r.log.ErrorContext(ctx, "relay: event failed", attrs...)
	} else {
		r.log.WarnContext(ctx, "relay: publish failed; retry scheduled", append(attrs, "retry_at", retryAt.UTC().Format(time.RFC3339))...)
	}
	if r.o.Ledger != nil {
		if err := r.o.Ledger.RecordPublishFailure(ctx, e, n, msg, final, time.Now().UTC()); err != nil {
			r.log.WarnContext(ctx, "relay: the ledger did not record a publish failure", append(logging.Event(e), "error", err.Error())...)
		}
	}
	return final, nil
}

func (r *Relay) encode(row *outbox.Row) (event.Message, error) {
	enc := event.EncodingJSON
	if r.o.Topology != nil {
		if t := r.o.Topology.Topic(row.Event.Topic); t != nil {
			if e, err := event.ParseEncoding(t.Encoding); err == nil {
				enc = e
			}
		}
	}
	m, err := event.Encode(&row.Event, enc)
	if err != nil {
		return m, err
	}
	if row.Target != "" {
		m.Attributes[topology.TargetConsumerAttr] = row.Target
	}
	return m, nil
}

// healLedger records again the sends the ledger missed.
func (r *Relay) healLedger(ctx context.Context) (int, error) {
	if r.o.Ledger == nil {
		return 0, nil
	}
	healed := 0
	for {
		evs, err := outbox.LedgerBehind(ctx, r.o.DB, r.o.BatchSize)
		if err != nil || len(evs) == 0 {
			return healed, err
		}
		ptrs := make([]*event.Event, len(evs))
		ids := make([]string, len(evs))
		for i := range evs {
			ptrs[i], ids[i] = &evs[i], evs[i].ID
		}
		if err := r.o.Ledger.RecordSent(ctx, ptrs, time.Now().UTC()); err != nil {
			return healed, err
		}
		if err := outbox.LedgerCaughtUp(ctx, r.o.DB, ids); err != nil {
			return healed, err
		}
		healed += len(evs)
		if len(evs) < r.o.BatchSize {
			return healed, nil
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return strings.TrimSpace(err.Error())
}

// Config is the relay's environment (github.com/sethvargo/go-envconfig), as
// the relay function and publish's fast path read it.
type Config struct {
	// TimeBudget bounds one scheduled drain (RELAY_TIME_BUDGET, 45s); keep
	// it under the Scheduler job's attempt deadline.
	TimeBudget time.Duration `env:"RELAY_TIME_BUDGET, default=45s"`
	// BatchSize is the most rows one claim takes (RELAY_BATCH_SIZE, 500).
	BatchSize int `env:"RELAY_BATCH_SIZE, default=500"`
	// Lease is how long a claim holds its rows (RELAY_LEASE, 2m).
	Lease time.Duration `env:"RELAY_LEASE, default=2m"`
	// MaxAttempts failed publishes make a row FAILED (RELAY_MAX_ATTEMPTS, 5).
	MaxAttempts int `env:"RELAY_MAX_ATTEMPTS, default=5"`
	// BackoffBase and BackoffMax shape the retry delays (RELAY_BACKOFF_BASE
	// 10s, RELAY_BACKOFF_MAX 10m).
	BackoffBase time.Duration `env:"RELAY_BACKOFF_BASE, default=10s"`
	BackoffMax  time.Duration `env:"RELAY_BACKOFF_MAX, default=10m"`
	// Retention is how long published rows are kept (OUTBOX_RETENTION, 24h).
	Retention time.Duration `env:"OUTBOX_RETENTION, default=24h"`
}

// Apply copies the configuration into o.
func (c Config) Apply(o *Options) {
	o.BatchSize, o.Lease, o.MaxAttempts = c.BatchSize, c.Lease, c.MaxAttempts
	o.BackoffBase, o.BackoffMax, o.Retention = c.BackoffBase, c.BackoffMax, c.Retention
}

// Env is everything a relay reads from the environment: the shared
// settings, the relay's Config, the outbox database and the ledger.
type Env struct {
	instance.Env
	Config
	// DatabaseURL is the outbox's Postgres (DATABASE_URL).
	DatabaseURL string `env:"DATABASE_URL"`
	// Ledger is firestore or off (LEDGER, firestore).
	Ledger string `env:"LEDGER, default=firestore"`
	// FirestoreDatabase is the ledger's database id (FIRESTORE_DATABASE).
	FirestoreDatabase string `env:"FIRESTORE_DATABASE, default=(default)"`
}

// Open builds a relay from env: the outbox (migrated), Pub/Sub (the
// emulator when PUBSUB_EMULATOR_HOST is set), the topology and, unless
// env.Ledger is "off", the Firestore ledger. The relay function and
// publish's fast path use it.
func Open(ctx context.Context, env Env, log *slog.Logger) (*Relay, error) {
	top, err := topology.Load(env.Topology)
	if err != nil {
		return nil, err
	}
	pool, err := instance.Postgres(ctx, env.DatabaseURL, outbox.Migrations)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*Relay, error) {
		pool.Close()
		return nil, err
	}
	ps, err := transport.New(ctx, env.ProjectID, transport.Options{})
	if err != nil {
		return fail(err)
	}
	o := Options{DB: pool, Publisher: ps, Topology: top, Logger: log}
	env.Config.Apply(&o)
	store, err := ledger.OpenMode(ctx, env.Ledger, ledger.Config{ProjectID: env.ProjectID, Database: env.FirestoreDatabase}, ledger.Options{Logger: log})
	if err != nil {
		_ = ps.Close()
		return fail(err)
	}
	if store != nil {
		o.Ledger = store
	}
	return New(o)
}
