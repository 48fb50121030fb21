package relay

import (
	"context"

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
	res, err := r.claimAndPublish(ctx, outbox.ClaimOptions{Events: ids, Aggregates: len(ids),
		RunLimit: fastRunLimit, Limit: len(ids) * fastRunLimit}, true)
	if err != nil {
		return nil, err
	}
	// The runs answer for the ids they published; the outbox for the rest.
	out := make(map[string]outbox.State, len(ids))
	var rest []string
	for _, id := range ids {
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
		RunLimit: r.o.RunLimit, Limit: r.o.BatchSize}, false); err != nil {
		r.log.WarnContext(ctx, "relay: kick failed; the scheduled drain publishes these events", "events", len(ids), "error", err.Error())
	}
}

// FlushKicks waits until every kick made so far has been through a claim.
func (r *Relay) FlushKicks(ctx context.Context) error {
	return r.kicks.Flush(ctx)
}
