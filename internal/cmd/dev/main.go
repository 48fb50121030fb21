// Command dev runs the whole of relaybus on this machine until Ctrl-C (make
// dev): Postgres, Pub/Sub, Firestore, the five functions on one address,
// the delivery loop and the scheduler. See internal/devstack.
//
//	go run ./internal/cmd/dev [-addr 127.0.0.1:8080] [-state .state] [-backoff-scale 0.05] [-project relaybus-local] [-pprof 127.0.0.1:6060]
//
// It parses its flags, then reads the environment once
// (devstack.LoadConfig): every function's own configuration struct, loaded
// as the function loads it, so each variable means and defaults to what it
// does in production, and the stack sets over them only what is local
// (docs/local-stack.md lists both): DATABASE_URL, PUBSUB_EMULATOR_HOST and
// FIRESTORE_EMULATOR_HOST use services that already run instead of
// starting them (two stacks sharing emulators need their own -project or
// GOOGLE_CLOUD_PROJECT); TRANSPORT=nats runs the stack on NATS JetStream
// (an embedded server, or NATS_URL's) instead of Pub/Sub (make dev
// TRANSPORT=nats); RELAYBUS_TOPOLOGY names another topology file than
// infra/topology.yaml; LOG_LEVEL (info, as in production) sets how much the
// functions log (to stderr, as JSON; LOG_LEVEL=warn for a quiet terminal
// under make load); FORWARD_SIGNING_SECRET signs the forward consumers'
// requests; DATABASE_URL_<NAME> names a topology database's own URL (read
// by internal/instance.DatabaseURLs, as the relay reads it); the OTEL_*
// variables and TELEMETRY_EXPORT export the stack's telemetry.
// RELAYBUS_DEV_ADDR and RELAYBUS_DEV_PG_BUDGET are the command's own: the
// address and the budget when -addr and -pg-budget are not given. A missing
// prerequisite prints one line each saying what to install, and the
// command exits 1.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	_ "net/http/pprof"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/relaybus/relaybus/internal/devstack"
	"github.com/relaybus/relaybus/internal/logging"
	"github.com/relaybus/relaybus/internal/otelsetup"
	"github.com/relaybus/relaybus/internal/telemetry"
	"github.com/relaybus/relaybus/shared/relay"
)

// flags is make dev's command line. Each flag's default is the stack's
// own (devstack.Default*, DefaultPostgresBudget), written once there; a
// flag given wins over the environment (RELAYBUS_DEV_ADDR,
// GOOGLE_CLOUD_PROJECT, RELAYBUS_DEV_PG_BUDGET), which wins over the
// default.
type flags struct {
	addr, state, project, pprof string
	scale                       float64
	pgBudget                    int
	// given are the flags on the command line, by name.
	given map[string]bool
}

// parseFlags defines make dev's flags on fs and parses args (without the
// program's name); with flag.CommandLine, -h prints the flags and exits
// and a bad flag exits 2.
func parseFlags(fs *flag.FlagSet, args []string) flags {
	var f flags
	fs.StringVar(&f.addr, "addr", devstack.DefaultAddr, "address the functions listen on ($RELAYBUS_DEV_ADDR)")
	fs.StringVar(&f.state, "state", devstack.DefaultStateDir, "directory for the throwaway Postgres cluster and dev.json")
	fs.Float64Var(&f.scale, "backoff-scale", devstack.DefaultBackoffScale, "multiplies the subscriptions' redelivery backoff (1 = the topology's retry policy, Pub/Sub's timing)")
	fs.StringVar(&f.project, "project", devstack.DefaultProject, "the Google Cloud project the emulators see ($GOOGLE_CLOUD_PROJECT)")
	fs.IntVar(&f.pgBudget, "pg-budget", devstack.DefaultPostgresBudget, "the most Postgres connections the stack holds at once, all its pools together ($RELAYBUS_DEV_PG_BUDGET)")
	fs.StringVar(&f.pprof, "pprof", "", "serve net/http/pprof on this address, to profile the stack under load (off when empty)")
	_ = fs.Parse(args) // flag.CommandLine exits on an error
	f.given = map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { f.given[fl.Name] = true })
	return f
}

// apply sets the flags over o, the options the environment set
// (devstack.Config.Options).
func (f flags) apply(o devstack.Options) devstack.Options {
	if f.given["addr"] || o.Addr == "" {
		o.Addr = f.addr
	}
	if f.given["project"] || o.Project == "" {
		o.Project = f.project
	}
	if f.given["pg-budget"] || o.PostgresBudget == 0 {
		o.PostgresBudget = f.pgBudget
	}
	o.StateDir, o.BackoffScale = f.state, f.scale
	return o
}

func main() {
	f := parseFlags(flag.CommandLine, os.Args[1:])
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg, err := devstack.LoadConfig(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "make dev:", err)
		os.Exit(2)
	}
	o := f.apply(cfg.Options())
	env := cfg.Functions.Publish.Env // every function reads these variables alike
	o.Logger = logging.New(os.Stderr, logging.Options{Level: logging.ParseLevel(env.LogLevel)})
	if f.pprof != "" {
		go func() {
			// The default mux carries net/http/pprof's handlers only.
			if err := http.ListenAndServe(f.pprof, nil); err != nil {
				fmt.Fprintln(os.Stderr, "make dev: pprof:", err)
			}
		}()
	}
	// Telemetry from the standard OTEL_* variables (internal/otelsetup,
	// docs/telemetry.md): exported when an OTEL_EXPORTER_OTLP_*ENDPOINT is
	// set, else off and silent.
	flush, err := otelsetup.Setup(ctx, otelsetup.Options{Config: env.Telemetry, ServiceName: "relaybus-dev", ProjectID: o.Project})
	if err != nil {
		fmt.Fprintln(os.Stderr, "make dev:", err)
		os.Exit(1)
	}
	// The outbox gauges read the stack's pools: they are flushed once the
	// last request is answered and unregistered before the pools close.
	var unobserve []func() error
	drained := func(ctx context.Context) {
		if err := otelsetup.ForceFlush(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "make dev: telemetry:", err)
		}
		for _, u := range unobserve {
			_ = u()
		}
	}
	start := time.Now()
	o.Drained = drained
	s, err := devstack.Start(ctx, o)
	if err != nil {
		for _, line := range strings.Split(err.Error(), "\n") {
			fmt.Fprintln(os.Stderr, "make dev:", line)
		}
		os.Exit(1)
	}
	for name, pool := range s.Pools {
		unobserve = append(unobserve, telemetry.ObserveOutbox(name, func(ctx context.Context) (telemetry.OutboxBacklog, error) { return relay.Backlog(ctx, pool) }))
	}
	fmt.Printf("relaybus local stack ready in %.1fs\n", time.Since(start).Seconds())
	for _, line := range s.Started {
		fmt.Println("  " + line)
	}
	fmt.Printf(`
Publish a first event:
  curl -s -X POST %s/publish -H 'Content-Type: application/json' \
    -d '{"eventType":"order.purchased","topic":"shop.order.events","aggregateId":"order-1","version":1,"source":"order-service","payload":{"orderId":"order-1","memberId":"m-1","amount":42}}'
Follow it:                  curl -s %s/dlqreplay/events/<eventId from the answer>
Run the purchase scenario:  make demo
Stop:                       Ctrl-C
`, s.Info.URL, s.Info.URL)
	<-ctx.Done()
	// A second Ctrl-C forces the stop. Its handler is in place before the
	// first one is released, so no signal finds the default action (which
	// would kill the process with a failing status).
	cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	force, unforce := signal.NotifyContext(cctx, os.Interrupt, syscall.SIGTERM)
	defer unforce()
	stop()
	fmt.Println("\nstopping: finishing in-flight work (up to 30s; Ctrl-C again to force)...")
	s.Close(force)
	if err := flush(cctx); err != nil {
		fmt.Fprintln(os.Stderr, "make dev: telemetry:", err)
	}
	if s.Delivery.HandedBack > 0 || s.Delivery.Lapsing > 0 {
		fmt.Println(s.Delivery.String())
	}
	// Ctrl-C is how make dev is meant to end: a stop is a success.
	fmt.Println("stopped")
}
