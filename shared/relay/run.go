package relay

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/relaybus/relaybus/internal/cloudevent"
	"github.com/relaybus/relaybus/internal/ledger/model"

	"github.com/relaybus/relaybus/internal/logging"
	"github.com/relaybus/relaybus/internal/telemetry"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/topology"
)

// publishers is how many runs of one claim are published at once.
const publishers = 32

// batchResult is what one claim came to.
type batchResult struct {
	runs, claimed, published, retried, failed, lost int
	// publishedIDs are the events Pub/Sub acknowledged (for the fast path's
	// claims only).
	publishedIDs map[string]bool
}

// how says how a claim is settled once its runs are published.
type how int

const (
	// drained: the drain's claim, settled at once (its worker claims
	// again after it, and counts what it settled).
	drained how = iota
	// kicked: a kick's claim (Kick, KickIn), settled in the background
	// with the others of SettleWait (settleLater).
	kicked
	// answered: the fast path's claim, bounded by ctx's deadline; its
	// answer waits for the settle (so no lease is left behind a request),
	// which shares its statement with the fast path's settles that
	// arrived while the one before it ran (settleSoon).
	answered
)

// claimAndPublish claims one batch (the drain's, or co's events for a
// kick), publishes every run and settles the batch as h says, handing the
// sends to the ledger's recorder. A publish under way and the settle
// finish even when ctx ends, so that what Pub/Sub has is recorded.
func (r *Relay) claimAndPublish(ctx context.Context, co outbox.ClaimOptions, h how) (batchResult, error) {
	cctx := ctx
	if h != answered {
		// A claim that has started finishes even when ctx ends (a drain's
		// deadline): its statement may commit the leases whatever the
		// client sees, and a claim cut short would leave them to expire
		// (RELAY_LEASE) with their aggregates waiting; finished, its runs
		// are settled (released unpublished when ctx has ended).
		var cancel context.CancelFunc
		cctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), r.o.Lease)
		defer cancel()
	}
	c, err := r.claim(cctx, r.o.DB, co)
	if err != nil {
		return batchResult{}, err
	}
	return r.publishClaimed(ctx, c, h)
}

// claimed is a claim not yet published: its runs, the time the lease
// started on the relay's clock, and the events it was asked for.
type claimed struct {
	runs      []outbox.Run
	claimedAt time.Time
	events    []string
}

// claim claims one batch through db (the pool, or the transaction that
// enqueued co.Events), with the relay's owner, lease and limits.
func (r *Relay) claim(ctx context.Context, db DB, co outbox.ClaimOptions) (claimed, error) {
	co.Owner, co.Lease, co.Now = r.o.Owner, r.o.Lease, r.dbNow()
	if co.Limit == 0 {
		co.Limit = r.o.BatchSize
	}
	if co.Aggregates == 0 {
		co.Aggregates = r.o.Aggregates
	}
	if co.RunLimit == 0 {
		co.RunLimit = r.o.RunLimit
	}
	claimedAt := r.now()
	runs, err := outbox.Claim(ctx, db, co)
	if err != nil {
		return claimed{}, err
	}
	return claimed{runs: runs, claimedAt: claimedAt, events: co.Events}, nil
}

// publishClaimed publishes every run of a claim and settles it (see
// claimAndPublish). With answered, ctx's deadline bounds the publishes
// too.
func (r *Relay) publishClaimed(ctx context.Context, c claimed, h how) (batchResult, error) {
	runs, claimedAt := c.runs, c.claimedAt
	res := batchResult{runs: len(runs)}
	if len(runs) == 0 {
		return res, nil
	}
	// The lease, as this relay's clock knows it: no publish starts after
	// its margin, and none outlives the lease. A publish under way finishes
	// even when ctx ends (Pub/Sub may already have it; the settle records
	// it); ctx ending only stops new ones from starting.
	stopAt := claimedAt.Add(r.o.Lease - r.o.LeaseMargin)
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.o.Lease-r.o.LeaseMargin)
	defer cancel()
	if h == answered {
		pctx, cancel = context.WithTimeout(ctx, r.o.Lease-r.o.LeaseMargin)
		defer cancel()
	}
	progress := make([]outbox.Progress, len(runs))
	if len(runs) == 1 {
		// One run (the fast path's usual claim: one request, one
		// aggregate) is published by the caller's goroutine: a goroutine
		// of its own would start on a small stack and grow it through the
		// broker client's calls on every request.
		res.claimed = len(runs[0].Rows)
		progress[0] = r.publishRun(ctx, pctx, &runs[0], stopAt)
		return r.finishClaim(ctx, c, runs, progress, h, res)
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, publishers)
	for i := range runs {
		res.claimed += len(runs[i].Rows)
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			progress[i] = r.publishRun(ctx, pctx, &runs[i], stopAt)
		}()
	}
	wg.Wait()
	return r.finishClaim(ctx, c, runs, progress, h, res)
}

// finishClaim settles a published claim as h says (see claimAndPublish).
func (r *Relay) finishClaim(ctx context.Context, c claimed, runs []outbox.Run, progress []outbox.Progress, h how, res batchResult) (batchResult, error) {
	switch h {
	case drained:
		_, err := r.settle(ctx, runs, progress, &res)
		return res, err
	case kicked:
		r.settleLater(ctx, runs, progress)
		return res, nil
	}
	// The fast path answers by its deadline: what Pub/Sub acknowledged is
	// published, whatever becomes of the settle, which finishes on its own
	// (a settle cut short would leave the leases to expire, and the events
	// waiting for them).
	res.publishedIDs = make(map[string]bool, len(c.events))
	for i, p := range progress {
		for _, row := range runs[i].Rows[:p.Rows] {
			res.publishedIDs[row.Event.ID] = true
		}
	}
	done := r.settleSoon(ctx, runs, progress)
	select {
	case err := <-done:
		return res, err
	case <-ctx.Done():
		return res, nil
	}
}

// settleTimeout bounds a settle: it records what Pub/Sub already has, so it
// runs even when the claim's context has ended.
const settleTimeout = 30 * time.Second

// settle settles a claimed batch, counts it in res and hands the sends to
// the ledger's recorder and the failures to the log and the ledger. It
// returns the next event of each aggregate that is due again at once
// (versions were enqueued while it was leased).
func (r *Relay) settle(ctx context.Context, runs []outbox.Run, progress []outbox.Progress, res *batchResult) ([]string, error) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	settled, err := outbox.Settle(sctx, r.o.DB, outbox.SettleOptions{Ledger: r.o.Ledger != nil, HealDelay: r.o.HealDelay, Now: r.dbNow()}, progress)
	if err != nil {
		return nil, err
	}
	moved := make(map[outbox.Aggregate]bool, len(settled))
	var next []string
	for _, s := range settled {
		moved[s.Aggregate] = s.Moved
		if s.Next != "" {
			next = append(next, s.Next)
		}
	}
	sentAt := time.Now().UTC()
	for i, p := range progress {
		run := &runs[i]
		if !moved[p.Aggregate] {
			if p.To > p.From || p.Failure != nil {
				res.lost++
				r.log.WarnContext(ctx, "relay: run not settled (lease lost, or a late version moved the cursor); it will be published again",
					"aggregate_type", p.Type, "aggregate_id", p.ID, "epoch", p.Epoch, "from_version", p.From, "to_version", p.To)
			}
			continue
		}
		res.published += p.Rows
		if f := p.Failure; f != nil {
			if f.Final {
				res.failed++
			} else {
				res.retried++
			}
			r.recordFailure(ctx, run, p)
		}
		if r.sends != nil && p.Rows > 0 {
			rec := recordedRun{Recorded: outbox.Recorded{Aggregate: p.Aggregate, From: p.From, To: p.To}}
			for _, row := range run.Rows[:p.Rows] {
				e := row.Event
				rec.sends = append(rec.sends, model.Sent{Event: &e, EnqueuedAt: row.EnqueuedAt, At: sentAt})
			}
			if !r.sends.Add(rec) {
				r.log.WarnContext(ctx, "relay: the ledger recorder is full; the healing step records these sends later",
					"aggregate_id", p.ID, "events", p.Rows)
			}
		}
	}
	return next, nil
}

// publishRun publishes one run in version order, as few requests as
// possible (one per topic segment of the run), and says how far it got. It
// starts no request once ctx has ended or the lease's margin is reached;
// the requests themselves run under pctx.
func (r *Relay) publishRun(ctx, pctx context.Context, run *outbox.Run, stopAt time.Time) outbox.Progress {
	p := outbox.Progress{Aggregate: run.Aggregate, Epoch: run.Epoch, From: run.From, To: run.From}
	rows := run.Rows
	for len(rows) > 0 {
		// The longest prefix on one topic, encoded.
		topic := rows[0].Event.Topic
		var msgs []event.Message
		var encErr, storeErr error
		for _, row := range rows {
			if row.Event.Topic != topic {
				break
			}
			m, err := r.encode(&row)
			if err != nil {
				encErr = err
				break
			}
			if r.o.Claims != nil {
				if m, err = r.o.Claims.Offload(pctx, topic, m); err != nil {
					// The store failed: worth a retry, unlike an event
					// that cannot be encoded.
					storeErr = err
					break
				}
			}
			msgs = append(msgs, m)
		}
		if len(msgs) > 0 {
			if ctx.Err() != nil || !r.now().Before(stopAt) {
				return p // stopping, or the lease is ending: leave the rest to whoever holds it next
			}
			n, err := r.publish(pctx, topic, msgs, rows[:len(msgs)])
			if n > 0 {
				p.To, p.Rows = rows[n-1].Event.Version, p.Rows+n
			}
			if err != nil {
				if pctx.Err() != nil {
					return p // out of lease: not a failure of the event
				}
				p.Failure = r.failure(run, p, rows[n].Event.Version, err, false)
				return p
			}
			rows = rows[n:]
			continue
		}
		if storeErr != nil {
			if pctx.Err() != nil {
				return p // out of lease: not a failure of the event
			}
			p.Failure = r.failure(run, p, rows[0].Event.Version, storeErr, false)
			return p
		}
		// The first row cannot be encoded: Pub/Sub could never take it.
		p.Failure = r.failure(run, p, rows[0].Event.Version, encErr, true)
		return p
	}
	return p
}

// publish publishes msgs (the encoded rows) to topic in one request, in a
// producer span linked to each row's producer (a run gathers events many
// requests enqueued) and recorded in the metrics.
func (r *Relay) publish(ctx context.Context, topic string, msgs []event.Message, rows []outbox.Row) (int, error) {
	if !telemetry.Enabled() {
		return r.o.Publisher.PublishBatch(ctx, topic, msgs)
	}
	tps := make([]string, len(rows))
	for i := range rows {
		tps[i] = rows[i].Traceparent
	}
	start := time.Now()
	sctx, span := telemetry.StartLinked(ctx, "publish "+topic, telemetry.KindProducer, tps,
		telemetry.KeySystem.String(telemetry.SystemPubSub), telemetry.KeyDestination.String(topic),
		telemetry.KeyOperationName.String("publish"), telemetry.KeyOperationType.String("send"),
		telemetry.KeyBatchCount.Int(len(msgs)))
	n, err := r.o.Publisher.PublishBatch(sctx, topic, msgs)
	span.End(err)
	at := time.Now()
	failed := 0
	if err != nil {
		failed = len(msgs) - n
	}
	telemetry.RecordPublish(ctx, topic, n, failed, at.Sub(start), err)
	for _, row := range rows[:n] {
		if !row.EnqueuedAt.IsZero() {
			telemetry.RecordHop(ctx, telemetry.HopEnqueueToPublish, topic, "", at.Sub(row.EnqueuedAt))
		}
	}
	return n, err
}

// failure describes a failed publish of version v, the run's first not
// acknowledged; final when it can never succeed.
func (r *Relay) failure(run *outbox.Run, p outbox.Progress, v int64, err error, final bool) *outbox.Failure {
	n := run.Attempts + 1
	if p.Rows > 0 {
		n = 1 // the versions before it went through: its first failure
	}
	var fe *event.FieldError
	if errors.As(err, &fe) {
		final = true
	}
	return &outbox.Failure{Version: v, Error: err.Error(), Final: final || n >= r.o.MaxAttempts,
		RetryAt: r.now().Add(r.retryAfter(n))}
}

// attemptsOf is the attempt count a settled failure recorded.
func attemptsOf(run *outbox.Run, p outbox.Progress) int {
	if p.Rows > 0 {
		return 1
	}
	return run.Attempts + 1
}

// recordFailure logs a settled failure (ERROR when final) and hands it to
// the ledger.
func (r *Relay) recordFailure(ctx context.Context, run *outbox.Run, p outbox.Progress) {
	f := p.Failure
	var e *event.Event
	for i := range run.Rows {
		if run.Rows[i].Event.Version == f.Version {
			e = &run.Rows[i].Event
		}
	}
	if e == nil {
		return
	}
	n := attemptsOf(run, p)
	attrs := append(logging.Event(e), "attempts", n, "error", f.Error)
	if f.Final {
		r.log.ErrorContext(ctx, "relay: event failed", append(attrs, "blocked", "its aggregate waits until an operator re-pushes it")...)
	} else {
		r.log.WarnContext(ctx, "relay: publish failed; retry scheduled", append(attrs, "retry_at", f.RetryAt.UTC().Format(time.RFC3339))...)
	}
	if r.failures != nil {
		ev := *e
		r.failures.Add(failureRecord{e: &ev, attempts: n, err: f.Error, final: f.Final, at: time.Now().UTC()})
	}
}

// encode turns a row into its Pub/Sub message: the topic's encoding
// (binary mode for a topic with schemas), the
// re-push's target as an attribute.
func (r *Relay) encode(row *outbox.Row) (event.Message, error) {
	enc := event.EncodingJSON
	if r.o.Topology != nil {
		if t := r.o.Topology.Topic(row.Event.Topic); t != nil {
			if e, err := event.ParseEncoding(t.Encoding); err == nil {
				enc = e
			}
			if len(t.Schemas) > 0 {
				// Pub/Sub validates the data against the topic's schema: the
				// payload alone, in binary mode (every send path validated it).
				enc = event.EncodingBinary
			}
		}
	}
	encode := cloudevent.Encode
	if r.o.Claims != nil {
		encode = cloudevent.EncodeLarge // Claims takes a large one's data out
	}
	m, err := encode(&row.Event, enc)
	if errors.Is(err, event.ErrTooLarge) {
		return m, fmt.Errorf("encode %s: %w (a relay with a claim check, CLAIM_CHECK_BUCKET, publishes it by reference; see docs/producing.md)", row.Event.ID, err)
	}
	if err != nil {
		return m, fmt.Errorf("encode %s: %w", row.Event.ID, err)
	}
	if row.Target != "" {
		m.Attributes[topology.TargetConsumerAttr] = row.Target
	}
	if row.Traceparent != "" {
		// The producer's trace context, where pubsub v2's OpenTelemetry
		// tracing puts it: the consumers continue its trace.
		m.Attributes[telemetry.AttrTraceparent] = row.Traceparent
	}
	return m, nil
}
