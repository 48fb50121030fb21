package devstack

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/relaybus/relaybus/internal/bridge"
	"github.com/relaybus/relaybus/shared/broker"
)

// On TRANSPORT=nats the stack runs on NATS JetStream instead of Pub/Sub:
// an embedded server (nats-server/v2) unless NATS_URL names a running one,
// the topology's streams and durable consumers (nats.Client.Provision), every
// consumer built by consume.Build in pull mode (CONSUMER_MODE=pull, the
// way a consumer reads NATS in production: JetStream has no HTTP push),
// and, for the rollup and the DLQ monitors, whose functions take pushes,
// a bridge: internal/pull's worker pulling their durable consumer and
// POSTing each message in push's wrapped shape (bridge). Only
// configuration differs from the Pub/Sub stack: every function is built by
// its own Build.

// startNATS starts an embedded JetStream server storing under dir (kept
// across restarts of the stack, as the Pub/Sub emulator's state is not),
// on a free port of 127.0.0.1, and returns it.
func startNATS(dir string) (*server.Server, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("nats: %w", err)
	}
	abs, _ := filepath.Abs(dir)
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: abs, NoSigs: true, NoLog: true})
	if err != nil {
		return nil, fmt.Errorf("nats: %w", err)
	}
	s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		return nil, fmt.Errorf("nats: the embedded server (store %s) was not ready in 10 s", abs)
	}
	return s, nil
}

// The bridges' bounds are the delivery loop's (Loop.MaxInFlight,
// Loop.MaxOutstanding, and a route's own MaxInFlight: rollupMaxInFlight
// for the rollup): rollup holds a request until its event is rolled up
// (its coalescing window, ROLLUP_WINDOW 5 s), so its route needs more in
// flight than a consumer's; with the pull worker's own default of 16 the
// ledger lagged the consumers by a minute in the crash test (lag p50
// 66-76 s).
const loopMaxInFlight = 64

// runBridges feeds each route over b (a broker without push) to its
// function's URL with internal/bridge until ctx ends, then drains them
// (what is in flight finishes, the rest is handed back). Routes never
// dead-letter (the rollup and DLQ monitor subscriptions have no
// dead-letter topic); their backoff is the route's.
func runBridges(ctx context.Context, b broker.Broker, project string, routes []Route, log *slog.Logger) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256, IdleConnTimeout: 90 * time.Second}}
	brs := make([]bridge.Route, 0, len(routes))
	for _, rt := range routes {
		inFlight := loopMaxInFlight
		if rt.MaxInFlight > 0 {
			inFlight = rt.MaxInFlight
		}
		brs = append(brs, bridge.Route{Subscription: rt.Subscription, Handler: bridge.Remote(client, rt.URL),
			MaxInFlight: inFlight, MinBackoff: rt.MinBackoff, MaxBackoff: rt.MaxBackoff})
	}
	if err := bridge.Run(ctx, bridge.Options{Source: b, Project: project, Routes: brs, Logger: log}); err != nil {
		log.Error("local delivery (nats): " + err.Error())
	}
}
