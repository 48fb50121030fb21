package relay

import (
	"context"

	"github.com/relaybus/relaybus/shared/outbox"
)

// settleJob is one published claim waiting for its settle; done, when not
// nil, receives the settle's error.
type settleJob struct {
	runs     []outbox.Run
	progress []outbox.Progress
	done     chan error
}

// settleLater hands a kick's published claim to the settler: the claims
// gathered over SettleWait are settled in one statement (settleBatch),
// where each took a transaction of its own. When the settler is full or
// closed it settles the claim at once.
func (r *Relay) settleLater(ctx context.Context, runs []outbox.Run, progress []outbox.Progress) {
	job := settleJob{runs: runs, progress: progress}
	if !r.settles.Add(job) {
		r.settleBatch(context.WithoutCancel(ctx), []settleJob{job})
	}
}

// settleSoon hands the fast path's published claim to its settler, which
// settles at once when idle and otherwise gathers the claims that arrive
// while a settle runs into the next statement (group commit: no wait is
// added, concurrent requests share a transaction). The channel receives
// the settle's error.
func (r *Relay) settleSoon(ctx context.Context, runs []outbox.Run, progress []outbox.Progress) <-chan error {
	job := settleJob{runs: runs, progress: progress, done: make(chan error, 1)}
	if !r.settlesNow.Add(job) {
		go r.settleBatch(context.WithoutCancel(ctx), []settleJob{job})
	}
	return job.done
}

// settleBatch settles gathered claims in one statement (outbox.Settle;
// their aggregates are distinct: each was leased by one claim) and kicks
// the aggregates that are due again at once, whose versions were enqueued
// while they were leased: the re-kick that keeps the wait for the settle
// from adding to their latency. A settle that fails leaves the leases to
// expire; the drain then publishes those runs again.
func (r *Relay) settleBatch(ctx context.Context, jobs []settleJob) {
	var (
		runs     []outbox.Run
		progress []outbox.Progress
	)
	for _, j := range jobs {
		runs = append(runs, j.runs...)
		progress = append(progress, j.progress...)
	}
	next, err := r.settle(ctx, runs, progress, &batchResult{})
	for _, j := range jobs {
		if j.done != nil {
			j.done <- err
		}
	}
	if err != nil {
		r.log.WarnContext(ctx, "relay: settle failed; the leases expire and the drain publishes these runs again",
			"runs", len(runs), "error", err.Error())
		return
	}
	if len(next) > 0 {
		// Refused only when the relay is closing: the aggregates are due,
		// and the drain takes them.
		r.kicks.Add(next...)
	}
}
