// Command dev runs the whole of relaybus on this machine until Ctrl-C (make
// dev): Postgres, Pub/Sub, Firestore, the five functions on one address,
// the delivery loop and the scheduler. See internal/devstack.
//
//	go run ./internal/cmd/dev [-addr 127.0.0.1:8080] [-state .state] [-backoff-scale 0.05] [-project relaybus-local] [-pprof 127.0.0.1:6060]
//
// DATABASE_URL, PUBSUB_EMULATOR_HOST and FIRESTORE_EMULATOR_HOST use
// services that already run instead of starting them (two stacks sharing
// emulators need their own -project or GOOGLE_CLOUD_PROJECT); RELAYBUS_DEV_ADDR
// sets the address when -addr is not given; TRANSPORT=nats runs the stack
// on NATS JetStream (an embedded server, or NATS_URL's) instead of Pub/Sub
// (make dev TRANSPORT=nats); RELAYBUS_TOPOLOGY names another
// topology file than infra/topology.yaml; LOG_LEVEL (warn) sets how much
// the functions log (to stderr, as JSON). A missing prerequisite prints one
// line each saying what to install, and the command exits 1.
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

	"github.com/sethvargo/go-envconfig"

	"github.com/relaybus/relaybus/internal/devstack"
	"github.com/relaybus/relaybus/internal/logging"
	"github.com/relaybus/relaybus/internal/telemetry"
	"github.com/relaybus/relaybus/shared/relay"
)

func main() {
	defAddr := os.Getenv("RELAYBUS_DEV_ADDR")
	if defAddr == "" {
		defAddr = "127.0.0.1:8080"
	}
	addr := flag.String("addr", defAddr, "address the functions listen on ($RELAYBUS_DEV_ADDR)")
	state := flag.String("state", ".state", "directory for the throwaway Postgres cluster and dev.json")
	scale := flag.Float64("backoff-scale", 1, "multiplies the subscriptions' redelivery backoff (1 = the topology's retry policy, Pub/Sub's timing)")
	defProject := os.Getenv("GOOGLE_CLOUD_PROJECT")
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
	level := os.Getenv("LOG_LEVEL")
	if level == "" {
		level = "warn"
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// Telemetry from the standard OTEL_* variables (internal/telemetry,
	// docs/telemetry.md): exported when an OTEL_EXPORTER_OTLP_*ENDPOINT is
	// set, else off and silent.
	var tel telemetry.Config
	if err := envconfig.Process(ctx, &tel); err != nil {
		fmt.Fprintln(os.Stderr, "make dev:", err)
		os.Exit(1)
	}
	flush, err := telemetry.Setup(ctx, telemetry.Options{Config: tel, ServiceName: "relaybus-dev", ProjectID: *project})
	if err != nil {
		fmt.Fprintln(os.Stderr, "make dev:", err)
		os.Exit(1)
	}
	// The outbox gauges read the stack's pools: they are flushed once the
	// last request is answered and unregistered before the pools close.
	var unobserve []func() error
	drained := func(ctx context.Context) {
		if err := telemetry.ForceFlush(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "make dev: telemetry:", err)
		}
		for _, u := range unobserve {
			_ = u()
		}
	}
	start := time.Now()
	s, err := devstack.Start(ctx, devstack.Options{
		Addr: *addr, StateDir: *state, BackoffScale: *scale, Project: *project, PostgresBudget: *pgBudget,
		DatabaseURL: os.Getenv("DATABASE_URL"), PubSubHost: os.Getenv("PUBSUB_EMULATOR_HOST"),
		FirestoreHost: os.Getenv("FIRESTORE_EMULATOR_HOST"), Topology: os.Getenv("RELAYBUS_TOPOLOGY"),
		Transport: os.Getenv("TRANSPORT"), NATSURL: os.Getenv("NATS_URL"),
		Logger:  logging.New(os.Stderr, logging.Options{Level: logging.ParseLevel(level)}),
		Drained: drained,
	})
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
