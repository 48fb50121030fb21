// Package relay drains the transactional outbox to Pub/Sub, an aggregate's
// run at a time.
//
// A drain runs up to Concurrency workers (one until a claim finds work).
// Each one claims aggregates
// (outbox.Claim: due aggregates, FOR UPDATE SKIP LOCKED, a lease that bumps
// the aggregate's epoch) with each one's run of unpublished versions,
// publishes every run as one ordered bundle (one Publish request per run,
// runs in parallel, the aggregate id as ordering key), and settles the
// batch in one statement (outbox.Settle: each cursor moves over what
// Pub/Sub acknowledged; a failure schedules a retry with capped exponential
// backoff, or makes the aggregate FAILED after MaxAttempts: kept, logged at
// ERROR and counted, blocking only its own aggregate until an operator
// re-pushes it). Workers pipeline naturally: while one publishes, another
// claims and a third settles.
//
// Order: an aggregate's run starts at its published cursor, and the cursor
// moves only over versions Pub/Sub acknowledged, under the lease's epoch.
// So version n+1 never reaches Pub/Sub before version n, whatever relays
// run at once and whatever fails. A relay checks its lease before each
// publish request and bounds the request by the lease; a relay that was
// paused past its lease (and taken over) publishes nothing more and cannot
// move the cursor. Pub/Sub has no conditional publish, so a pause between
// that check and the request reaching Pub/Sub can still let a duplicate
// through after the new holder's messages: LeaseMargin bounds how long that
// window may be, and the consumers' inboxes and version gates absorb it.
//
// The ledger records, it does not gate: sends are recorded after they are
// published, in the background and in batches (RecordSent within
// LedgerBudget), and settled aggregates wait in the outbox's ledger queue
// until the recorder reports them; what it misses (Firestore down, the
// process gone) the drain's healing step records later, concurrently with
// claiming and bounded by the drain's budget. A Firestore outage slows the
// record, never the events.
//
// PublishNow (publish's fast path) and Kick (the post-commit kick of child
// events and Go producers) publish given events at once through the same
// claim, publish and settle code, except that their settles are gathered
// into one statement (a transaction per event otherwise): the kicks' over
// SettleWait, in the background (a version enqueued while its aggregate
// waits for the settle is kicked when the settle finds it); the fast
// path's as they come, each request waiting for its own (group commit).
package relay

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/relaybus/relaybus/internal/ledger/model"

	"github.com/relaybus/relaybus/internal/batch"
	"github.com/relaybus/relaybus/internal/logging"
	"github.com/relaybus/relaybus/internal/pack"
	"github.com/relaybus/relaybus/internal/retry"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/postgres"
	"github.com/relaybus/relaybus/shared/topology"
)

// Defaults of Options, and of the RELAY_* and OUTBOX_RETENTION variables
// (Config's tags; internal/instance's TestEachDefaultIsWrittenOnce ties
// the two).
const (
	DefaultBatchSize    = 1000
	DefaultAggregates   = 1000
	DefaultRunLimit     = 500
	DefaultConcurrency  = 4
	DefaultLease        = 20 * time.Second
	DefaultMaxAttempts  = 5
	DefaultBackoffBase  = 10 * time.Second
	DefaultBackoffMax   = 10 * time.Minute
	DefaultRetention    = 24 * time.Hour
	DefaultLedgerBudget = 10 * time.Second
	DefaultHealDelay    = 30 * time.Second
	DefaultSettleWait   = 50 * time.Millisecond
	DefaultLedgerWait   = 100 * time.Millisecond
	DefaultMaxPack      = 100
	// purgeBatch bounds one retention delete.
	purgeBatch = 5000
	// fastRunLimit bounds the run the fast path publishes per aggregate: an
	// event behind a longer backlog is left to the drain.
	fastRunLimit = 100
)

// DB is what the relay needs of Postgres (a *pgxpool.Pool).
type DB = postgres.DBTX

// Publisher is what the relay needs of Pub/Sub (a broker driver: shared/broker).
type Publisher interface {
	// PublishBatch publishes msgs to topic in order and returns how many
	// Pub/Sub acknowledged (a prefix) and the error that stopped it.
	PublishBatch(ctx context.Context, topic string, msgs []event.Message) (int, error)
}

// Offloader takes the data of a message too large for the broker out of it
// (internal/claimcheck's Checker): it returns the message to send, with a
// reference to the stored data in place of a large one.
type Offloader interface {
	Offload(ctx context.Context, topic string, m event.Message) (event.Message, error)
}

// Ledger records sends and publish failures (a *ledger.Store).
type Ledger interface {
	RecordSent(ctx context.Context, sends []model.Sent) error
	RecordPublishFailure(ctx context.Context, e *event.Event, attempts int, lastError string, final bool, at time.Time) error
}

// Options configure a Relay. DB and Publisher are required.
type Options struct {
	DB        DB
	Publisher Publisher
	// Topology gives each topic's payload encoding (JSON when nil or when
	// the topic is not declared).
	Topology *topology.Topology
	// Ledger, when set, records sends and publish failures after the fact.
	Ledger Ledger
	// Claims, when set, is the claim check: each encoded message goes
	// through its Offload before it is published, so one over its
	// threshold is published as a reference to the stored data (see
	// docs/producing.md, "Large payloads"). Nil publishes every message
	// whole, and an event whose message is over the broker's limit fails
	// for good (FAILED) at its first publish.
	Claims Offloader
	// BatchSize is the most rows one claim takes (DefaultBatchSize).
	BatchSize int
	// Aggregates is the most aggregates one claim leases (DefaultAggregates).
	// A claim leases aggregates only while their runs fit in BatchSize, so
	// a deep backlog is shared between the workers a few aggregates each.
	Aggregates int
	// RunLimit is the most rows of one aggregate one claim takes
	// (DefaultRunLimit).
	RunLimit int
	// Concurrency is how many claim/publish/settle workers one Drain runs
	// (DefaultConcurrency).
	Concurrency int
	// Lease is how long a claim holds its aggregates (DefaultLease).
	Lease time.Duration
	// SettleWait is how long the settle of a kick's claim (Kick, KickIn)
	// waits for others to share its statement (DefaultSettleWait). The
	// claim's aggregates stay leased until then: a version enqueued
	// meanwhile is kicked when the settle finds it (outbox.Settled.Next),
	// and a process that dies first leaves its runs to be published again
	// once the lease expires (the consumers' inboxes absorb the copies).
	// The drain settles each of its claims at once, and the fast path
	// (PublishNow, PublishClaimed) before it answers, sharing a statement
	// only with the fast path's settles that arrived while the one before
	// it ran.
	SettleWait time.Duration
	// LeaseMargin is how long before its lease expires a relay stops
	// publishing (Lease/4 when zero).
	LeaseMargin time.Duration
	// MaxAttempts is how many failed publishes make an aggregate FAILED
	// (DefaultMaxAttempts).
	MaxAttempts int
	// BackoffBase and BackoffMax: the n-th failure of an aggregate's head
	// retries after BackoffBase·2^(n-1), at most BackoffMax, spread by
	// ±20% jitter and never past BackoffMax (retry.Policy;
	// DefaultBackoffBase, DefaultBackoffMax), so the heads that failed
	// together in one outage are not all due in the same drain again.
	BackoffBase, BackoffMax time.Duration
	// Retention is how long published rows are kept (DefaultRetention);
	// negative keeps them forever.
	Retention time.Duration
	// History is what retention keeps in the outbox database's history
	// instead of deleting it (docs/history.md); when its zero value and
	// Topology is set, each topic's history_retention_days.
	History outbox.History
	// LedgerBudget bounds one batch of ledger writes (DefaultLedgerBudget).
	LedgerBudget time.Duration
	// MaxPack is how many consecutive re-pushes of one aggregate addressed
	// to one consumer travel as one message, a pack (internal/pack), which
	// the consumer applies in one transaction (DefaultMaxPack; at most
	// pack.MaxMessages). 1 sends each alone. Only a consumer the Topology
	// declares on the topic, delivered by push or pull, with no extra
	// filter and not forwarding, gets packs, and only on a topic without a
	// schema; without a Topology every re-push goes alone.
	MaxPack int
	// HealDelay is how long after a send the healing step may record it
	// when the live recorder has not (DefaultHealDelay).
	HealDelay time.Duration
	// LedgerWait is how long the sends settled after one another gather
	// before one RecordSent writes them (DefaultLedgerWait; at most
	// HealDelay/5). The record follows the answer, so the wait adds to the
	// ledger's lag only: publish's fast path settles an event a request,
	// and at 200 requests a second a 100 ms wait writes about 20 sends a
	// Firestore request where a wait of a few milliseconds wrote one or
	// two. Close and FlushLedger cut it short.
	LedgerWait time.Duration
	// Owner names this relay in leases (random when empty).
	Owner string
	// Now is the relay's clock for leases, retries and the database's
	// comparisons; nil is time.Now for the relay and the database's own
	// clock for its queries. Tests move it.
	Now func() time.Time
	// Logger receives the structured logs (logging.Discard when nil).
	Logger *slog.Logger
}

// Relay drains the outbox. It is safe for concurrent use. Close it to flush
// the ledger writes it still holds.
type Relay struct {
	o   Options
	log *slog.Logger

	sends    *batch.Batcher[recordedRun]
	failures *batch.Batcher[failureRecord]
	// marks gathers the ledger cursor moves of recorded runs, written in
	// one statement per markWait (see recordSends).
	marks *batch.Batcher[outbox.Recorded]

	kicks *batch.Batcher[string]
	// kicked counts the claims KickIn handed over still being published.
	kicked sync.WaitGroup

	// settles gathers the kicks' published claims, to settle them in one
	// statement per SettleWait (settleLater); settlesNow the fast path's,
	// settled at once or with those that arrived while the one before ran
	// (settleSoon).
	settles, settlesNow *batch.Batcher[settleJob]

	// lastPurge is when a drain of this relay last applied retention
	// (unix nanoseconds on the relay's clock).
	lastPurge atomic.Int64
}

// idlePurgeEvery is how often a drain that claimed nothing applies
// retention: rows only become old enough to delete by the hour, and each
// purge is two statements, which an idle stack would otherwise commit at
// every scheduled drain.
const idlePurgeEvery = time.Minute

// New returns a relay over o.
func New(o Options) (*Relay, error) {
	if o.DB == nil || o.Publisher == nil {
		return nil, errors.New("relay: Options.DB and Options.Publisher are required")
	}
	if o.BatchSize <= 0 {
		o.BatchSize = DefaultBatchSize
	}
	if o.Aggregates <= 0 {
		o.Aggregates = DefaultAggregates
	}
	if o.RunLimit <= 0 {
		o.RunLimit = DefaultRunLimit
	}
	if o.Concurrency <= 0 {
		o.Concurrency = DefaultConcurrency
	}
	if o.Lease <= 0 {
		o.Lease = DefaultLease
	}
	if o.SettleWait <= 0 {
		o.SettleWait = DefaultSettleWait
	}
	if o.LeaseMargin <= 0 || o.LeaseMargin >= o.Lease {
		o.LeaseMargin = o.Lease / 4
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
	if o.History.Default == 0 && o.History.Topics == nil && o.Topology != nil {
		o.History.Topics = map[string]time.Duration{}
		for _, t := range o.Topology.Topics {
			o.History.Topics[t.Name] = t.HistoryRetention()
		}
	}
	if o.LedgerBudget <= 0 {
		o.LedgerBudget = DefaultLedgerBudget
	}
	if o.MaxPack <= 0 {
		o.MaxPack = DefaultMaxPack
	}
	o.MaxPack = min(o.MaxPack, pack.MaxMessages)
	if o.HealDelay <= 0 {
		o.HealDelay = DefaultHealDelay
	}
	if o.LedgerWait <= 0 {
		o.LedgerWait = DefaultLedgerWait
	}
	o.LedgerWait = min(o.LedgerWait, o.HealDelay/5)
	if o.Owner == "" {
		b := make([]byte, 6)
		_, _ = rand.Read(b)
		o.Owner = "relay-" + hex.EncodeToString(b)
	}
	if o.Logger == nil {
		o.Logger = logging.Discard()
	}
	r := &Relay{o: o, log: o.Logger}
	r.kicks = batch.New(r.kick, batch.Options{MaxItems: 500, MaxWait: 200 * time.Microsecond, Capacity: 20_000, Workers: 2})
	r.settles = batch.New(r.settleBatch, batch.Options{MaxItems: 500, MaxWait: o.SettleWait, Capacity: 20_000})
	r.settlesNow = batch.New(r.settleBatch, batch.Options{MaxItems: 500, MaxWait: time.Microsecond, Capacity: 20_000})
	if o.Ledger != nil {
		// One batch at a time, in order: a run's ledger cursor moves only
		// after the run before it of the same aggregate.
		r.sends = batch.New(r.recordSends, batch.Options{MaxItems: 200, MaxWait: o.LedgerWait, Capacity: 20_000})
		r.failures = batch.New(r.recordFailures, batch.Options{MaxItems: 100, Capacity: 10_000})
		r.marks = batch.New(r.markRecorded, batch.Options{MaxItems: 5000, MaxWait: markWait(o.HealDelay), Capacity: 50_000})
	}
	return r, nil
}

// Close flushes the ledger writes and kicks the relay still holds, within
// ctx, and stops its background work. What it cuts is recorded later by a
// drain's healing step (sends) or published by the next drain (kicks).
func (r *Relay) Close(ctx context.Context) error {
	errs := []error{r.kicks.Close(ctx), r.waitKicked(ctx), r.settles.Close(ctx), r.settlesNow.Close(ctx)}
	if r.sends != nil {
		errs = append(errs, r.sends.Close(ctx), r.failures.Close(ctx), r.marks.Close(ctx))
	}
	return errors.Join(errs...)
}

// now is the relay's clock.
func (r *Relay) now() time.Time {
	if r.o.Now != nil {
		return r.o.Now()
	}
	return time.Now()
}

// dbNow is the time the relay's queries compare with: zero (the database's
// own clock) unless a test set Now.
func (r *Relay) dbNow() time.Time {
	if r.o.Now != nil {
		return r.o.Now()
	}
	return time.Time{}
}

// retryAfter returns the delay before an aggregate's head is tried again
// after its n-th failure (n ≥ 1), under Options.BackoffBase and BackoffMax.
func (r *Relay) retryAfter(n int) time.Duration {
	return retry.Policy{Initial: r.o.BackoffBase, Max: r.o.BackoffMax}.Delay(n)
}

// Summary is what one Drain did.
type Summary struct {
	// Claimed rows were leased by this drain.
	Claimed int `json:"claimed"`
	// Published rows Pub/Sub acknowledged (and this drain settled).
	Published int `json:"published"`
	// Retried aggregates had a publish fail and a retry scheduled.
	Retried int `json:"retried"`
	// Failed aggregates reached MaxAttempts and are FAILED.
	Failed int `json:"failed"`
	// Lost runs were settled by nobody: the lease was taken over, or a late
	// version moved the cursor under them; they are published again.
	Lost int `json:"lost"`
	// Repushed re-pushes were published.
	Repushed int `json:"repushed"`
	// Remaining events are still pending (including not yet due retries
	// and events blocked behind a FAILED version).
	Remaining int `json:"remaining"`
	// FailedTotal is every FAILED event waiting for an operator.
	FailedTotal int `json:"failed_total"`
	// Purged published rows were deleted by retention.
	Purged int `json:"purged"`
	// LedgerHealed sends the ledger had missed were recorded.
	LedgerHealed int `json:"ledger_healed"`
	// DurationMS is how long the drain took.
	DurationMS int64 `json:"duration_ms"`
}

func (s *Summary) add(b batchResult) {
	s.Claimed += b.claimed
	s.Published += b.published
	s.Retried += b.retried
	s.Failed += b.failed
	s.Lost += b.lost
}

// Drain publishes until nothing is due or budget runs out, with
// Concurrency workers; meanwhile it records the sends the ledger missed
// (bounded by the budget, never holding up a claim) and publishes queued
// re-pushes; then it applies retention (after a drain that claimed
// something, or at most once a minute when idle) and counts what is left.
// An error means the drain stopped early; the summary says what it did.
func (r *Relay) Drain(ctx context.Context, budget time.Duration) (Summary, error) {
	start := time.Now()
	deadline := start.Add(budget)
	dctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	var (
		sum      Summary
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
	)
	fail := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
	}
	if r.o.Ledger != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, err := r.heal(dctx)
			mu.Lock()
			sum.LedgerHealed = n
			mu.Unlock()
			if err != nil && dctx.Err() == nil {
				r.log.WarnContext(ctx, "relay: ledger healing failed; the next drain tries again", "error", err.Error())
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		n, err := r.repushes(dctx)
		mu.Lock()
		sum.Repushed = n
		mu.Unlock()
		if err != nil && dctx.Err() == nil {
			fail(err)
		}
	}()
	// Workers: one claims first; the others start only once a claim found
	// work, so a drain with nothing due costs one claim, not Concurrency.
	// A worker whose claim came back empty waits (no polling) until
	// another settles a batch, which may have made more versions of its
	// aggregates due, and then claims again; with every worker idle the
	// drain is done.
	var (
		workers sync.WaitGroup
		wmu     sync.Mutex
		settled = sync.NewCond(&wmu)
		batches int // non-empty batches settled so far
		active  int // workers inside claimAndPublish
		spawn   sync.Once
	)
	var worker func()
	worker = func() {
		defer workers.Done()
		for dctx.Err() == nil {
			wmu.Lock()
			active++
			seen := batches
			wmu.Unlock()
			b, err := r.claimAndPublish(dctx, outbox.ClaimOptions{}, drained)
			wmu.Lock()
			active--
			if b.runs > 0 {
				batches++
			}
			settled.Broadcast()
			wmu.Unlock()
			mu.Lock()
			sum.add(b)
			mu.Unlock()
			if err != nil {
				if dctx.Err() == nil {
					fail(err)
				}
				return
			}
			if b.runs > 0 {
				spawn.Do(func() {
					for range r.o.Concurrency - 1 {
						workers.Add(1)
						go worker()
					}
				})
				continue
			}
			wmu.Lock()
			for batches == seen && active > 0 {
				settled.Wait()
			}
			again := batches != seen
			wmu.Unlock()
			if !again {
				return
			}
		}
	}
	workers.Add(1)
	go worker()
	workers.Wait()
	wg.Wait() // the healing step and the re-pushes end by themselves, or at the deadline
	if last := r.lastPurge.Load(); firstErr == nil && r.o.Retention > 0 &&
		(sum.Claimed > 0 || last == 0 || r.now().Sub(time.Unix(0, last)) >= idlePurgeEvery) {
		r.lastPurge.Store(r.now().UnixNano())
		// Retention gets what is left of the budget, at least a moment.
		pctx, pcancel := context.WithTimeout(ctx, max(time.Until(deadline), 2*time.Second))
		for pctx.Err() == nil {
			n, err := outbox.PurgeWith(pctx, r.o.DB, outbox.PurgeOptions{Before: r.now().Add(-r.o.Retention), Limit: purgeBatch,
				Ledger: r.o.Ledger != nil, History: r.o.History})
			sum.Purged += n
			if err != nil {
				if pctx.Err() == nil {
					fail(err)
				}
				break
			}
			if n < purgeBatch {
				break
			}
		}
		if pctx.Err() == nil {
			if _, err := outbox.PruneHistory(pctx, r.o.DB, r.now()); err != nil {
				fail(err)
			}
		}
		pcancel()
	}
	if c, err := outbox.Count(ctx, r.o.DB); err == nil {
		sum.Remaining, sum.FailedTotal = c.Pending+c.Blocked, c.Failed
	} else if firstErr == nil {
		firstErr = err
	}
	sum.DurationMS = time.Since(start).Milliseconds()
	level := slog.LevelInfo
	if firstErr != nil {
		level = slog.LevelError
	}
	r.log.Log(ctx, level, "relay: drain", "claimed", sum.Claimed, "published", sum.Published, "retried", sum.Retried,
		"failed", sum.Failed, "lost", sum.Lost, "repushed", sum.Repushed, "remaining", sum.Remaining,
		"failed_total", sum.FailedTotal, "purged", sum.Purged, "ledger_healed", sum.LedgerHealed,
		"duration_ms", sum.DurationMS, "error", errString(firstErr))
	return sum, firstErr
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return strings.TrimSpace(err.Error())
}

// FlushLedger waits until the ledger writes queued so far (sends and
// publish failures) have been tried and the ledger cursors of what they
// recorded moved, or ctx ends.
func (r *Relay) FlushLedger(ctx context.Context) error {
	if r.sends == nil {
		return nil
	}
	return errors.Join(r.sends.Flush(ctx), r.failures.Flush(ctx), r.marks.Flush(ctx))
}
