package relay

import (
	"context"

	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
)

// PublishNow publishes the given events at once through the same claim,
// publish and settle code Drain uses, within ctx's deadline (publish's
// fast path answers a request): it claims their aggregates if they are
// due (not leased by another relay, not waiting out a retry, not FAILED)
// with each one's run up to a short limit, publishes and settles, and
// returns each id's state afterwards: published, or pending when it could
// not (another relay holds the aggregate and will publish it, a retry is
// scheduled, it is behind a longer backlog, or behind a FAILED version),
// failed. Ids not in the outbox are absent from the map.
func (r *Relay) PublishNow(ctx context.Context, ids ...string) (map[string]outbox.State, error) {
	if len(ids) == 0 {
		return map[string]outbox.State{}, nil
	}
	c, err := r.claim(ctx, r.o.DB, fastClaim(ids))
	if err != nil {
		return nil, err
	}
	return r.answer(ctx, c)
}

// fastClaim is the fast path's claim of ids' aggregates.
func fastClaim(ids []string) outbox.ClaimOptions {
	return outbox.ClaimOptions{Events: ids, Aggregates: len(ids), RunLimit: fastRunLimit, Limit: len(ids) * fastRunLimit}
}

// Claim is a fast path's claim made by the statement that enqueued its
// events (EnqueueNow), published by PublishClaimed.
type Claim struct {
	c   claimed
	ids []string
	// rest are the pending events the statement did not lease: claimed
	// by PublishClaimed as PublishNow claims.
	rest []string
}

// EnqueueNow writes events into the outbox and, in the same statement
// (outbox.EnqueueClaim), leases the aggregates of the pending ones whose
// new versions are their only unpublished ones, as PublishNow would: one
// autocommit statement for the write and the fast path's lease, where
// Enqueue then PublishNow took two transactions. Pass the claim to
// PublishClaimed, which publishes what was leased and claims the rest
// (events behind a backlog, an aggregate another relay holds) as
// PublishNow does. The lease is the one every claim takes (the aggregate's
// epoch bumped, due again when it expires), so a process that dies before
// publishing leaves the events to the next drain.
func (r *Relay) EnqueueNow(ctx context.Context, events ...*event.Event) ([]outbox.Enqueued, *Claim, error) {
	claimedAt := r.now()
	enq, runs, err := outbox.EnqueueClaim(ctx, r.o.DB, outbox.ClaimOptions{Owner: r.o.Owner, Lease: r.o.Lease,
		RunLimit: fastRunLimit, Now: r.dbNow()}, events...)
	if err != nil {
		return nil, nil, err
	}
	cl := &Claim{ids: pendingIDs(enq)}
	if len(cl.ids) == 0 {
		return enq, cl, nil
	}
	cl.c = claimed{runs: runs, claimedAt: claimedAt, events: cl.ids}
	leased := make(map[string]bool, len(cl.ids))
	for _, run := range runs {
		for _, row := range run.Rows {
			leased[row.Event.ID] = true
		}
	}
	for _, id := range cl.ids {
		if !leased[id] {
			cl.rest = append(cl.rest, id)
		}
	}
	return enq, cl, nil
}

func pendingIDs(enq []outbox.Enqueued) []string {
	var ids []string
	for _, q := range enq {
		if q.State == outbox.StatePending {
			ids = append(ids, q.ID)
		}
	}
	return ids
}

// PublishClaimed publishes and settles a claim EnqueueNow made, within
// ctx's deadline, claims and publishes the claim's other pending events as
// PublishNow does, and answers as PublishNow does for all of them.
func (r *Relay) PublishClaimed(ctx context.Context, cl *Claim) (map[string]outbox.State, error) {
	if cl == nil || len(cl.ids) == 0 {
		return map[string]outbox.State{}, nil
	}
	if len(cl.c.runs) == 0 {
		return r.PublishNow(ctx, cl.ids...)
	}
	if len(cl.rest) == 0 {
		return r.answer(ctx, cl.c)
	}
	// Both at once: the leased runs, and a claim of the rest.
	var (
		rest    map[string]outbox.State
		restErr error
		done    = make(chan struct{})
	)
	go func() {
		defer close(done)
		rest, restErr = r.PublishNow(ctx, cl.rest...)
	}()
	out, err := r.answer(ctx, claimed{runs: cl.c.runs, claimedAt: cl.c.claimedAt, events: leasedIDs(cl.c.runs)})
	<-done
	if err != nil {
		return nil, err
	}
	if restErr != nil {
		return out, restErr
	}
	for id, st := range rest {
		out[id] = st
	}
	return out, nil
}

func leasedIDs(runs []outbox.Run) []string {
	var ids []string
	for _, run := range runs {
		for _, row := range run.Rows {
			ids = append(ids, row.Event.ID)
		}
	}
	return ids
}

// answer publishes a fast path's claim and returns each of its events'
// state afterwards (see PublishNow).
func (r *Relay) answer(ctx context.Context, c claimed) (map[string]outbox.State, error) {
	res, err := r.publishClaimed(ctx, c, answered)
	if err != nil {
		return nil, err
	}
	// The runs answer for the ids they published; the outbox for the rest.
	out := make(map[string]outbox.State, len(c.events))
	var rest []string
	for _, id := range c.events {
		if res.publishedIDs[id] {
			out[id] = outbox.StatePublished
		} else {
			rest = append(rest, id)
		}
	}
	if len(rest) == 0 {
		return out, nil
	}
	found, err := outbox.Lookup(ctx, r.o.DB, rest...)
	if err != nil {
		return nil, err
	}
	for id, e := range found {
		out[id] = e.State
	}
	return out, nil
}

// Kick asks the relay to publish the given events now, after the
// transaction that enqueued them committed (a consumer's child events, a
// Go producer's events): it returns at once, and a background worker
// publishes them through PublishNow, many kicks in one claim. A kick that
// does not fit in the queue is dropped; the scheduled drain publishes those
// events. Close the relay to finish the kicks it holds.
func (r *Relay) Kick(ids ...string) {
	if len(ids) == 0 {
		return
	}
	if !r.kicks.Add(ids...) {
		r.log.Warn("relay: kick queue full; the scheduled drain publishes these events", "events", len(ids))
	}
}

// kick publishes one batch of kicked events.
func (r *Relay) kick(ctx context.Context, ids []string) {
	ctx, cancel := context.WithTimeout(ctx, r.o.Lease-r.o.LeaseMargin)
	defer cancel()
	if _, err := r.claimAndPublish(ctx, outbox.ClaimOptions{Events: ids, Aggregates: len(ids),
		RunLimit: r.o.RunLimit, Limit: r.o.BatchSize}, kicked); err != nil {
		r.log.WarnContext(ctx, "relay: kick failed; the scheduled drain publishes these events", "events", len(ids), "error", err.Error())
	}
}

// KickIn claims, in tx (the transaction that enqueued ids, before it
// commits), the aggregates of ids as the kick after the commit would, and
// returns what to call once tx committed: it publishes and settles that
// claim in the background (FlushKicks and Close wait for it). The claim
// commits with the events, one transaction fewer than a kick; if tx rolls
// back it goes with it (call nothing then). Its lease is every claim's: a
// process that dies before publishing leaves the events to the drain once
// the lease expires.
func (r *Relay) KickIn(ctx context.Context, tx DB, ids ...string) (func(), error) {
	if len(ids) == 0 {
		return func() {}, nil
	}
	c, err := r.claim(ctx, tx, outbox.ClaimOptions{Events: ids, Aggregates: len(ids), RunLimit: r.o.RunLimit, Limit: r.o.BatchSize})
	if err != nil {
		return nil, err
	}
	return func() {
		r.kicked.Add(1)
		go func() {
			defer r.kicked.Done()
			ctx, cancel := context.WithTimeout(context.Background(), r.o.Lease-r.o.LeaseMargin)
			defer cancel()
			if _, err := r.publishClaimed(ctx, c, kicked); err != nil {
				r.log.WarnContext(ctx, "relay: kick failed; the scheduled drain publishes these events", "events", len(ids), "error", err.Error())
			}
		}()
	}, nil
}

// waitKicked waits until the claims KickIn handed over are published and
// settled, or ctx ends.
func (r *Relay) waitKicked(ctx context.Context) error {
	done := make(chan struct{})
	go func() { r.kicked.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// FlushKicks waits until every kick made so far has been through a claim
// and its settle.
func (r *Relay) FlushKicks(ctx context.Context) error {
	if err := r.kicks.Flush(ctx); err != nil {
		return err
	}
	if err := r.waitKicked(ctx); err != nil {
		return err
	}
	return r.settles.Flush(ctx)
}
