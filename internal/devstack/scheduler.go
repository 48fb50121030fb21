package devstack

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/relaybus/relaybus/shared/topology"
)

// job is one of the local scheduler's jobs.
type job struct {
	url   string
	every time.Duration
}

// jobs are the jobs Terraform creates on Cloud Scheduler, at the local
// cadences: each database's drain, the ledger's catch-up (rollup's
// reconcile, each consumer's ledger:ship), each strict consumer's gap
// check, each forward Eventarc consumer's breaker probe, expiry and the
// inboxes' purge.
// pushes: the broker pushes (Pub/Sub); without, every consumer pulls and
// its breaker pauses nothing.
func jobs(base string, o Options, databases []string, consumers []mountedConsumer, pushes bool) []job {
	js := []job{
		{base + "/rollup/expire", o.ExpireEvery},
		{base + "/rollup/reconcile", o.LedgerEvery},
	}
	for _, name := range databases {
		js = append(js, job{base + "/relay/?database=" + name, o.RelayEvery})
	}
	for _, c := range consumers {
		js = append(js, job{c.URL + "/ledger:ship", o.LedgerEvery}, job{c.URL + "/inbox:purge", o.PurgeEvery})
	}
	for _, c := range consumers {
		if c.Handler == topology.HandlerStrict {
			js = append(js, job{c.URL + "/gaps:check", o.LedgerEvery})
		}
		// Its breaker pauses it by its flag while the target is down; the
		// probe resumes it. (A push consumer's breaker pauses nothing here:
		// the delivery loop pulls its subscription, which has no endpoint.)
		if pushes && c.Handler == topology.HandlerForward && c.Delivery == topology.DeliveryEventarc && c.ForwardBreakerThreshold >= 0 {
			js = append(js, job{c.URL + "/breaker:probe", o.LedgerEvery})
		}
	}
	if pushes {
		// The forwarders service's: each forwarder's breaker records its
		// pause, which the probe lifts once the target answers.
		js = append(js, job{base + forwardersPath + "/breaker:probe", o.LedgerEvery})
	}
	return js
}

// runScheduler runs every job until ctx ends, and returns once all have
// stopped.
func runScheduler(ctx context.Context, log *slog.Logger, js []job) {
	done := make(chan struct{}, len(js))
	for _, j := range js {
		go func() { schedule(ctx, log, j.url, j.every); done <- struct{}{} }()
	}
	for range js {
		<-done
	}
}

// schedule POSTs to url every d, as Cloud Scheduler calls the functions'
// jobs; a failed call is logged and the next tick tries again.
func schedule(ctx context.Context, log *slog.Logger, url string, d time.Duration) {
	t := time.NewTicker(d)
	defer t.Stop()
	client := &http.Client{Timeout: 2 * time.Minute}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
			resp, err := client.Do(req)
			if err != nil {
				if ctx.Err() == nil {
					log.Warn("local scheduler: call failed", "url", url, "error", err.Error())
				}
				continue
			}
			resp.Body.Close()
			if resp.StatusCode >= 300 {
				log.Warn("local scheduler: call refused", "url", url, "status", resp.StatusCode)
			}
		}
	}
}
