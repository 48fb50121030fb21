package devstack

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/benchcheck"
	"github.com/relaybus/relaybus/internal/emutest"
)

// BenchmarkLocalStack starts the stack as make dev does with nothing
// running (a fresh Postgres cluster, durable as in production, the
// Firestore emulator, pstest in the process). Then, with the load
// generator make load uses (open loop: every latency runs from the
// request's scheduled send time):
//
//   - e2e: order.purchased at 200 requests/s for 10 s (two consumers:
//     member-service by push, message-service by Eventarc); the scheduled
//     send to each consumer's commit (its inbox row's commit timestamp), and
//     to CONSUMED in the ledger (statusAt). Requests that were not
//     accepted are counted on their own line, never in the percentiles.
//   - local_sustained_events_per_s: the highest of the rates in
//     RELAYBUS_BENCH_SUSTAIN (requests/s, "50,100,200,300,500") that the stack
//     carries for RELAYBUS_BENCH_SUSTAIN_FOR (60s): every request accepted,
//     every event delivered to both consumers, and the delivery backlog
//     gone within 10 s of the last request (a backlog that grew during
//     the run would take longer). The rates are tried in order and the
//     search stops at the first that fails.
func BenchmarkLocalStack(b *testing.B) {
	ctx := context.Background()
	for range b.N {
		s, ob := startBenchStack(b)

		const rate, seconds = 200, 10
		conns := ob.SampleConnections(ctx, time.Second)
		lr := StartLoad(ctx, LoadOptions{URL: s.Info.URL, Rate: rate, Duration: seconds * time.Second})
		<-lr.Done
		rep, err := ob.Check(ctx, lr, 3*time.Minute, nil)
		if err != nil {
			b.Fatal(err)
		}
		peak, samples, _ := conns.Stop()
		// A run that lost, left undelivered or unfinished in the ledger any
		// accepted event prints no figure.
		requireWhole(b, rep)
		commit, undelivered, err := commitLatencies(ctx, ob, lr)
		if err != nil {
			b.Fatal(err)
		}
		if undelivered > 0 || len(commit) != rep.Accepted*len(ob.Consumers) {
			b.Fatalf("e2e: %d of %d accepted deliveries missing: the run prints no figure", undelivered, rep.Accepted*len(ob.Consumers))
		}
		if err := requireInboxes(ctx, b, ob, lr); err != nil {
			b.Fatal(err)
		}
		fmt.Printf("# connections: pg_stat_activity's client backends sampled each second over the e2e run and its drain (%d samples), the observer's own left out; budget %d (DefaultPostgresBudget), durable Postgres\n", samples, DefaultPostgresBudget)
		benchcheck.Figure(b, "local_pg_connections_peak", float64(peak), "connections")
		e2e := percentiles(commit)
		fmt.Printf("# e2e: order.purchased at %d req/s for %d s (open loop) over 2 consumers (push and Eventarc shapes) on the local stack, durable Postgres; scheduled send → each consumer's commit; → CONSUMED in the ledger\n", rate, seconds)
		fmt.Printf("# e2e: %d requests, %d accepted, %d skipped, refused %v (not in the percentiles); every accepted event delivered to both consumers and CONSUMED in the ledger after %v; e2e over %d deliveries, e2e_consumed over %d events\n",
			rep.Scheduled, rep.Accepted, rep.Skipped, rep.Refused, rep.DrainedIn.Round(time.Second), e2e.N, rep.EndToConsumed.N)
		benchcheck.Figure(b, "e2e_p50_ms", e2e.P50, "ms")
		benchcheck.Figure(b, "e2e_p99_ms", e2e.P99, "ms")
		benchcheck.Figure(b, "e2e_consumed_p50_ms", rep.EndToConsumed.P50, "ms")
		benchcheck.Figure(b, "e2e_consumed_p99_ms", rep.EndToConsumed.P99, "ms")

		best := 0.0
		for _, r := range sustainRates(b) {
			ok, why := sustains(ctx, ob, s.Info.URL, r, sustainFor(b))
			fmt.Printf("# sustained: %g req/s for %v: %s\n", r, sustainFor(b), why)
			if !ok {
				break
			}
			best = r
		}
		if best == 0 {
			b.Fatalf("local_sustained_events_per_s: the stack did not carry even the lowest rate (%g req/s) for %v", sustainRates(b)[0], sustainFor(b))
		}
		benchcheck.Figure(b, "local_sustained_events_per_s", best, "ev/s")
		ob.Close()
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		s.Close(cctx)
		cancel()
	}
}

// sustains publishes at rate for d and reports whether the stack carried
// it: every request accepted, every event delivered to every consumer, the
// backlog gone within 10 s of the last request.
func sustains(ctx context.Context, ob *Observer, url string, rate float64, d time.Duration) (bool, string) {
	lr := StartLoad(ctx, LoadOptions{URL: url, Rate: rate, Duration: d})
	<-lr.Done
	end := time.Now()
	sent, accepted, refused, _, skipped := lr.Counts()
	if refused > 0 || skipped > 0 || accepted != sent {
		return false, fmt.Sprintf("%d of %d accepted (%d refused, %d skipped)", accepted, sent, refused, skipped)
	}
	ids := acceptedIDs(lr)
	for {
		inbox, err := ob.Inbox(ctx, ids)
		if err != nil {
			return false, err.Error()
		}
		missing := 0
		for _, c := range ob.Consumers {
			missing += len(ids) - len(inbox[c.Service])
		}
		switch {
		case missing == 0:
			return true, fmt.Sprintf("all %d accepted, every delivery done %v after the last request", accepted, time.Since(end).Round(100*time.Millisecond))
		case time.Since(end) > 10*time.Second:
			return false, fmt.Sprintf("all %d accepted, but %d deliveries still missing 10 s after the last request", accepted, missing)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// startBenchStack starts the stack as make dev does with nothing running
// (its own durable Postgres cluster, the Firestore emulator, pstest in the
// process) and an observer of it; the cluster's directory goes when the
// benchmark ends.
func startBenchStack(b *testing.B) (*Stack, *Observer) {
	b.Helper()
	ctx := context.Background()
	// The cluster runs as the postgres user when we are root: its
	// directory must be reachable (b.TempDir is 0700).
	state, err := os.MkdirTemp("", "relaybus-bench-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(state) })
	_ = os.Chmod(state, 0o755)
	s, err := Start(ctx, Options{Addr: "127.0.0.1:0", StateDir: state, Project: emutest.UniqueProject(b), DurablePostgres: true})
	if err != nil {
		b.Fatal(err)
	}
	ob, err := Observe(ctx, s.Info, s.Topology)
	if err != nil {
		b.Fatal(err)
	}
	return s, ob
}

// commitLatencies returns, for every accepted request of lr and every
// consumer, the time from the request's scheduled send to the consumer's
// commit, and how many of those deliveries are missing.
func commitLatencies(ctx context.Context, ob *Observer, lr *LoadRun) (lat []time.Duration, missing int, err error) {
	inbox, err := ob.Inbox(ctx, acceptedIDs(lr))
	if err != nil {
		return nil, 0, err
	}
	for _, r := range lr.Requests {
		if !r.Accepted() {
			continue
		}
		for _, c := range ob.Consumers {
			at, ok := inbox[c.Service][r.ID]
			if !ok {
				missing++
				continue
			}
			lat = append(lat, at.Sub(r.At))
		}
	}
	return lat, missing, nil
}

// requireInboxes checks each consumer's inbox against the run: every
// accepted event applied (once: the inbox's key), per aggregate in the
// order published (each load event is its own aggregate's version 1).
func requireInboxes(ctx context.Context, b *testing.B, ob *Observer, lr *LoadRun) error {
	inbox, err := ob.Inbox(ctx, acceptedIDs(lr))
	if err != nil {
		return err
	}
	for _, c := range ob.Consumers {
		sink := benchcheck.NewDetailedSink()
		for _, r := range lr.Requests {
			if r.Accepted() {
				sink.Sent("order-"+r.ID, r.ID)
				if _, ok := inbox[c.Service][r.ID]; ok {
					sink.Got("order-"+r.ID, r.ID)
				}
			}
		}
		sink.Require(b, "e2e, "+c.Service)
	}
	return nil
}

func acceptedIDs(lr *LoadRun) []string {
	var ids []string
	for _, r := range lr.Requests {
		if r.Accepted() {
			ids = append(ids, r.ID)
		}
	}
	return ids
}

func sustainRates(b *testing.B) []float64 {
	spec := os.Getenv("RELAYBUS_BENCH_SUSTAIN")
	if spec == "" {
		spec = "50,100,200,300,500"
	}
	var out []float64
	for _, f := range strings.Split(spec, ",") {
		r, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || r <= 0 {
			b.Fatalf("RELAYBUS_BENCH_SUSTAIN: %q is not a rate", f)
		}
		out = append(out, r)
	}
	return out
}

func sustainFor(b *testing.B) time.Duration {
	if v := os.Getenv("RELAYBUS_BENCH_SUSTAIN_FOR"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			b.Fatalf("RELAYBUS_BENCH_SUSTAIN_FOR: %q is not a duration", v)
		}
		return d
	}
	return time.Minute
}
