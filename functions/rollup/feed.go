package rollup

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/relaybus/relaybus/internal/bridge"
	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/internal/instance/natsopen"
	"github.com/relaybus/relaybus/shared/broker"
	"github.com/relaybus/relaybus/shared/topology"
)

// In pull mode (ROLLUP_MODE=pull, on NATS, where nothing pushes) the
// function pulls its notices itself. Build connects to the NATS server, provisions the topology's streams and
// durable consumers (nats.Client.Provision, idempotent: the deployed
// operations API does the same at its start, so whichever starts first
// creates them) and feeds the rollup's durable consumer to the handler in
// process (internal/bridge), as a push would: one notice in flight per
// ordering key, a refused notice retried after 1 s doubling to 1 min, an
// acknowledgement after the fold. The instance must keep its CPU between
// requests (Terraform's nats transport sets min instances and cpu_idle).

// Feed settings on NATS.
const (
	// FeedMaxInFlight bounds the notices folded at once: a notice waits
	// up to the coalescing window for its event's other consumers, so the
	// feed needs many in flight (the local stack's push loop allows as
	// many).
	FeedMaxInFlight = 1024
	feedMinBackoff  = time.Second
	feedMaxBackoff  = time.Minute
)

// feed starts the NATS feed of h and returns what stops it: the notices in
// flight finish (within ctx), the rest are handed back, the connection is
// closed.
func feed(ctx context.Context, p instance.PubSub, project string, top *topology.Topology, h *Handler, log *slog.Logger) (func(context.Context) error, error) {
	nc, err := natsopen.Open(ctx, p, "rollup")
	if err != nil {
		return nil, err
	}
	if err := nc.Provision(ctx, top); err != nil {
		_ = nc.Close()
		return nil, fmt.Errorf("rollup: provision NATS: %w", err)
	}
	sub := broker.RollupSubscription(top)
	fctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() {
		done <- bridge.Run(fctx, bridge.Options{Source: nc, Project: project, Logger: log,
			Routes: []bridge.Route{{Subscription: sub, Handler: h, MaxInFlight: FeedMaxInFlight, MinBackoff: feedMinBackoff, MaxBackoff: feedMaxBackoff}}})
	}()
	log.Info("rollup: pulling", "subscription", sub, "transport", p.Transport)
	return func(ctx context.Context) error {
		stop()
		var err error
		select {
		case err = <-done:
		case <-ctx.Done():
			err = fmt.Errorf("rollup: NATS feed still draining at shutdown: %w", ctx.Err())
		}
		if cerr := nc.Close(); cerr != nil && err == nil {
			err = cerr
		}
		return err
	}, nil
}
