package devstack

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

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
		fmt.Printf("# connections: pg_stat_activity's client backends sampled each second over the e2e run and its drain (%d samples), the observer's own left out; budget %d (DefaultPostgresBudget), durable Postgres\n", samples, DefaultPostgresBudget)
		fmt.Printf("BENCH local_pg_connections_peak %d connections\n", peak)
		commit, undelivered, err := commitLatencies(ctx, ob, lr)
		if err != nil {
			b.Fatal(err)
		}
		if len(commit) == 0 {
			b.Fatal("no event was delivered")
		}
		e2e := percentiles(commit)
		fmt.Printf("# e2e: order.purchased at %d req/s for %d s (open loop) over 2 consumers (push and Eventarc shapes) on the local stack, durable Postgres; scheduled send → each consumer's commit; → CONSUMED in the ledger\n", rate, seconds)
		fmt.Printf("# e2e: %d requests, %d accepted, %d skipped, refused %v; %d accepted deliveries missing after %v; %d events CONSUMED in the ledger\n",
			rep.Scheduled, rep.Accepted, rep.Skipped, rep.Refused, undelivered, rep.DrainedIn.Round(time.Second), rep.Consumed)
		fmt.Printf("BENCH e2e_p50_ms %.1f ms\nBENCH e2e_p99_ms %.1f ms\n", e2e.P50, e2e.P99)
		if rep.EndToConsumed.N > 0 {
			fmt.Printf("BENCH e2e_consumed_p50_ms %.1f ms\nBENCH e2e_consumed_p99_ms %.1f ms\n", rep.EndToConsumed.P50, rep.EndToConsumed.P99)
		}

		best := 0.0
		for _, r := range sustainRates(b) {
			ok, why := sustains(ctx, ob, s.Info.URL, r, sustainFor(b))
			fmt.Printf("# sustained: %g req/s for %v: %s\n", r, sustainFor(b), why)
			if !ok {
				break
			}
			best = r
		}
		if best > 0 {
			fmt.Printf("BENCH local_sustained_events_per_s %g ev/s\n", best)
		}
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
