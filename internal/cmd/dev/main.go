// Command dev runs the whole of relaybus on this machine until Ctrl-C (make
// dev): Postgres, Pub/Sub, Firestore, the five functions on one address,
// the delivery loop and the scheduler. See internal/devstack.
//
//	go run ./internal/cmd/dev [-addr 127.0.0.1:8080] [-state .state] [-backoff-scale 0.05] [-project relaybus-local] [-pprof 127.0.0.1:6060]
//
// The functions' variables it honours are read through the functions' own
// configuration structs (see config), so each means and defaults to what
// it does in production: DATABASE_URL, PUBSUB_EMULATOR_HOST and
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
// variables and TELEMETRY_EXPORT export the stack's telemetry. RELAYBUS_DEV_ADDR and RELAYBUS_DEV_PG_BUDGET are the
// command's own: -addr's and -pg-budget's defaults. A missing
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
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/relaybus/relaybus/functions/consume"
	"github.com/relaybus/relaybus/internal/devstack"
	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/internal/logging"
	"github.com/relaybus/relaybus/internal/otelsetup"
	"github.com/relaybus/relaybus/internal/telemetry"
	"github.com/relaybus/relaybus/shared/relay"
)

// config is what make dev reads of the functions' environment: the
// pieces of the functions' own configuration (internal/instance), loaded by
// instance.Load as the functions load theirs, so a variable has one
// default and an invalid value fails naming it. The stack sets everything
// else itself (devstack.Start builds each function's configuration from
// instance.Defaults); of what config reads, SHUTDOWN_TIMEOUT,
// DATABASE_DIRECT_URL and the ledger's FIRESTORE_DATABASE,
// LEDGER_RETENTION and LEDGER_RECONCILE_AFTER are not used: Ctrl-C waits
// up to 30 s, migrations run on the stack's own database, and the ledger
// keeps the functions' defaults (reconciling after 15 s).
type config struct {
	// Env: GOOGLE_CLOUD_PROJECT (-project's default), LOG_LEVEL,
	// RELAYBUS_TOPOLOGY, and telemetry's OTEL_* and TELEMETRY_EXPORT.
	Env instance.Env
	// DB: DATABASE_URL.
	DB instance.Database
	// PubSub: PUBSUB_EMULATOR_HOST, TRANSPORT and NATS_URL.
	PubSub instance.PubSub
	// Ledger: FIRESTORE_EMULATOR_HOST.
	Ledger instance.Ledger
	// Consume: FORWARD_SIGNING_SECRET, the forward consumers' signing
	// secret; the stack sets the rest of each consumer's configuration
	// from the topology.
	Consume consume.Config
}

// options is the part of the stack's options the environment sets: the
// services to use instead of starting them, the topology, the broker and
// the functions' logger at LOG_LEVEL.
func (c config) options() devstack.Options {
	return devstack.Options{
		DatabaseURL: c.DB.URL, PubSubHost: c.PubSub.EmulatorHost, FirestoreHost: c.Ledger.EmulatorHost,
		Topology: c.Env.Topology, Transport: c.PubSub.Transport, NATSURL: c.PubSub.NATSURL,
		ForwardSigningSecret: c.Consume.ForwardSigningSecret,
		Logger:               logging.New(os.Stderr, logging.Options{Level: logging.ParseLevel(c.Env.LogLevel)}),
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg, err := instance.Load[config](ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "make dev:", err)
		os.Exit(2)
	}
	defAddr := os.Getenv("RELAYBUS_DEV_ADDR")
	if defAddr == "" {
		defAddr = "127.0.0.1:8080"
	}
	addr := flag.String("addr", defAddr, "address the functions listen on ($RELAYBUS_DEV_ADDR)")
	state := flag.String("state", ".state", "directory for the throwaway Postgres cluster and dev.json")
	scale := flag.Float64("backoff-scale", 1, "multiplies the subscriptions' redelivery backoff (1 = the topology's retry policy, Pub/Sub's timing)")
	defProject := cfg.Env.ProjectID
	if defProject == "" {
		defProject = "relaybus-local"
	}
	project := flag.String("project", defProject, "the Google Cloud project the emulators see ($GOOGLE_CLOUD_PROJECT)")
	defBudget := devstack.DefaultPostgresBudget
	if v := os.Getenv("RELAYBUS_DEV_PG_BUDGET"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			fmt.Fprintf(os.Stderr, "make dev: RELAYBUS_DEV_PG_BUDGET=%q: want a positive number of connections\n", v)
			os.Exit(2)
		}
		defBudget = n
	}
	pgBudget := flag.Int("pg-budget", defBudget, "the most Postgres connections the stack holds at once, all its pools together ($RELAYBUS_DEV_PG_BUDGET)")
	pprofAddr := flag.String("pprof", "", "serve net/http/pprof on this address, to profile the stack under load (off when empty)")
	flag.Parse()
	if *pprofAddr != "" {
		go func() {
			// The default mux carries net/http/pprof's handlers only.
			if err := http.ListenAndServe(*pprofAddr, nil); err != nil {
				fmt.Fprintln(os.Stderr, "make dev: pprof:", err)
			}
		}()
	}
	// Telemetry from the standard OTEL_* variables (internal/otelsetup,
	// docs/telemetry.md): exported when an OTEL_EXPORTER_OTLP_*ENDPOINT is
	// set, else off and silent.
	flush, err := otelsetup.Setup(ctx, otelsetup.Options{Config: cfg.Env.Telemetry, ServiceName: "relaybus-dev", ProjectID: *project})
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
	o := cfg.options()
	o.Addr, o.StateDir, o.BackoffScale, o.Project, o.PostgresBudget = *addr, *state, *scale, *project, *pgBudget
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
