package devstack

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/relaybus/relaybus/internal/delivery"
	"github.com/relaybus/relaybus/internal/pull"
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

// bridge delivers one JetStream durable consumer to an HTTP endpoint as a
// push subscription would: the wrapped push body, one message in flight
// per ordering key, redelivery of a refused message after the backoff
// with its key's later messages behind it, acknowledgement after a 2xx
// (internal/pull's Worker does all of that; this is its engine).
type bridge struct {
	http *http.Client
	// url receives the requests; sub names the subscription in them.
	url, sub string
	// timeout bounds one request (the subscription's ack deadline).
	timeout time.Duration
	// cut ends the requests still in flight a little after shutdown
	// began (rollup holds a request up to its coalescing window, longer
	// for an event not in the ledger yet): the worker hands their
	// messages back, as the loop does at its shutdown timeout.
	cut context.Context
}

// Handle POSTs the delivery and answers with the endpoint's status (0
// when no answer came: refused, as push counts it).
func (b bridge) Handle(ctx context.Context, d delivery.Delivery) pull.Answer {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	defer context.AfterFunc(b.cut, cancel)()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.url, bytes.NewReader(delivery.WrappedBody(d.Message, b.sub, d.Message.DeliveryAttempt)))
	if err != nil {
		return pull.Answer{Error: err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := b.http.Do(req)
	if err != nil {
		return pull.Answer{Error: err.Error()}
	}
	resp.Body.Close()
	return pull.Answer{Status: resp.StatusCode}
}

// The bridges' bounds are the delivery loop's (Loop.MaxInFlight,
// Loop.MaxOutstanding, and a route's own MaxInFlight: rollupMaxInFlight
// for the rollup): rollup holds a request until its event is rolled up
// (its coalescing window, ROLLUP_WINDOW 5 s), so its route needs more in
// flight than a consumer's; with the pull worker's own default of 16 the
// ledger lagged the consumers by a minute in the crash test (lag p50
// 66-76 s).
const (
	loopMaxInFlight    = 64
	loopMaxOutstanding = 1000
	// bridgeGrace is how long the deliveries in flight at shutdown may
	// finish before they are cut (the loop's ShutdownTimeout less its
	// reserve: 8 s).
	bridgeGrace = 8 * time.Second
)

// runBridges runs a pull worker per route over b (a broker without push)
// until ctx ends, then
// drains them (what is in flight finishes, the rest is handed back).
// Routes never dead-letter (the rollup and DLQ monitor subscriptions have
// no dead-letter topic); their backoff is the route's.
func runBridges(ctx context.Context, b broker.Broker, project string, routes []Route, log *slog.Logger) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256, IdleConnTimeout: 90 * time.Second}}
	cut, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stop := context.AfterFunc(ctx, func() {
		t := time.NewTimer(bridgeGrace)
		defer t.Stop()
		select {
		case <-t.C:
			cancel()
		case <-cut.Done():
		}
	})
	defer stop()
	var wg sync.WaitGroup
	for _, rt := range routes {
		inFlight := loopMaxInFlight
		if rt.MaxInFlight > 0 {
			inFlight = rt.MaxInFlight
		}
		w, err := pull.New(pull.Options{Source: b, Subscription: rt.Subscription, DeadLetters: b, Project: project,
			Engine:      bridge{http: client, url: rt.URL, sub: "projects/" + project + "/subscriptions/" + rt.Subscription, timeout: time.Minute, cut: cut},
			MaxInFlight: inFlight, MaxOutstanding: max(loopMaxOutstanding, inFlight), MaxAttempts: 1 << 30,
			MinBackoff: rt.MinBackoff, MaxBackoff: rt.MaxBackoff, Logger: log})
		if err != nil { // only a missing option gets here
			log.Error("local delivery (nats): "+err.Error(), "subscription", rt.Subscription)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := w.Run(ctx); err != nil {
				log.Error("local delivery (nats): worker stopped", "subscription", rt.Subscription, "error", err.Error())
			}
		}()
	}
	wg.Wait()
}
