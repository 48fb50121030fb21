// Command load drives a running local stack (make dev) with the demo's
// order.purchased events at a fixed rate, open loop, shows progress once a
// second and ends with a report: requests accepted and refused, events
// delivered to each consumer, end-to-end latency (scheduled send →
// consumer's inbox commit), ledger lag (last consumer commit → CONSUMED)
// and anything stuck after a drain wait (make load).
//
//	go run ./internal/cmd/load [-rate 200] [-duration 60s] [-drain 60s] [-members 100] [-state .state]
//
// It reads the stack's addresses (its databases included) from
// <state>/dev.json, written by make dev. It exits 1 when anything is stuck
// or lost.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/relaybus/relaybus/internal/devstack"
	"github.com/relaybus/relaybus/shared/topology"
)

func main() {
	rate := flag.Float64("rate", 200, "publish requests per second")
	duration := flag.Duration("duration", 60*time.Second, "how long to publish")
	drain := flag.Duration("drain", 60*time.Second, "how long to wait afterwards for every event to be delivered and final in the ledger")
	members := flag.Int("members", 100, "members the orders are spread over")
	state := flag.String("state", ".state", "the stack's state directory (dev.json)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *state, devstack.LoadOptions{Rate: *rate, Duration: *duration, Members: *members}, *drain); err != nil {
		fmt.Fprintln(os.Stderr, "load:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, state string, o devstack.LoadOptions, drain time.Duration) error {
	info, err := devstack.ReadInfo(state)
	if err != nil {
		return err
	}
	// The topology as make dev reads it (RELAYBUS_TOPOLOGY, through
	// devstack.LoadConfig).
	cfg, err := devstack.LoadConfig(ctx)
	if err != nil {
		return err
	}
	top, err := topology.Load(cfg.Options().Topology)
	if err != nil {
		return err
	}
	ob, err := devstack.Observe(ctx, info, top)
	if err != nil {
		return err
	}
	defer ob.Close()
	o.URL = info.URL
	lr := devstack.StartLoad(ctx, o)
	o = lr.Options
	fmt.Printf("load: %g req/s for %v against %s (run %s: order.purchased on %s, %d members, open loop)\n",
		o.Rate, o.Duration, o.URL, o.Run, devstack.LoadTopic, o.Members)
	start := time.Now()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var last int64
	for running := true; running; {
		select {
		case <-lr.Done:
			running = false
		case <-ctx.Done():
			<-lr.Done
			running = false
		case <-tick.C:
		}
		sent, accepted, refused, open, skipped := lr.Counts()
		ids := make([]string, 0, sent)
		for _, r := range lr.Requests[:min(int(sent+skipped), len(lr.Requests))] {
			ids = append(ids, r.ID)
		}
		line := fmt.Sprintf("%4.0fs  sent %6d (+%4d)  accepted %6d  refused %4d  open %4d", time.Since(start).Seconds(), sent, sent-last, accepted, refused, open)
		if skipped > 0 {
			line += fmt.Sprintf("  skipped %d", skipped)
		}
		last = sent
		qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 900*time.Millisecond)
		if inbox, err := ob.Inbox(qctx, ids); err == nil {
			line += "  | delivered"
			for _, c := range ob.Consumers {
				line += fmt.Sprintf(" %s %d", c.Service, len(inbox[c.Service]))
			}
		}
		if pending, _, err := ob.Unpublished(qctx); err == nil {
			line += fmt.Sprintf("  | outbox unpublished %d", pending)
		}
		cancel()
		fmt.Println(line)
	}
	if ctx.Err() != nil {
		fmt.Println("load: interrupted; checking what was sent")
	}
	fmt.Printf("load: sent; waiting up to %v for every event to be delivered and final in the ledger\n", drain)
	rep, err := ob.Check(context.WithoutCancel(ctx), lr, drain, os.Stdout)
	if err != nil {
		return err
	}
	rep.Print(os.Stdout)
	if rep.OutboxPending+rep.OutboxFailed > 0 {
		if lines, err := ob.Backlog(context.WithoutCancel(ctx), 5); err == nil && len(lines) > 0 {
			fmt.Println("  outbox backlog (relaybus_outbox_backlog, first 5 per database):")
			for _, l := range lines {
				fmt.Println("    " + l)
			}
		}
	}
	if rep.Stuck() {
		return fmt.Errorf("events stuck or lost (above)")
	}
	return nil
}
