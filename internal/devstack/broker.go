package devstack

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"cloud.google.com/go/pubsub/v2/pstest"

	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/internal/instance/brokeropen"
	"github.com/relaybus/relaybus/internal/pstestserver"
	"github.com/relaybus/relaybus/shared/broker"
	"github.com/relaybus/relaybus/shared/broker/pubsub"
	"github.com/relaybus/relaybus/shared/topology"
)

// localBroker is a transport as the local stack runs it: a server of its
// own unless the options name a running one, and the stack's client of
// it. Which one runs is the only thing TRANSPORT chooses (localBrokers);
// what the stack does differently afterwards is asked of the broker
// (broker.PushConfigurer), never of its name.
type localBroker interface {
	// serve starts the local server unless o names one, and says how the
	// functions reach the broker.
	serve(ctx context.Context, o Options, down *teardown) (brokerServer, error)
	// connect opens the stack's own client of the broker cfg names.
	connect(ctx context.Context, cfg instance.PubSub, project string) (brokerClient, error)
}

// localBrokers are the transports the stack runs on, by TRANSPORT.
var localBrokers = map[string]localBroker{
	instance.TransportPubSub: pubsubLocal{},
	instance.TransportNATS:   natsLocal{},
}

// localBrokerOf is the transport named, or an error naming TRANSPORT.
func localBrokerOf(transport string) (localBroker, error) {
	if transport == "" {
		transport = instance.Defaults[instance.PubSub]().Transport
	}
	lb, ok := localBrokers[transport]
	if !ok {
		return nil, fmt.Errorf("TRANSPORT=%q: want %s or %s", transport, instance.TransportPubSub, instance.TransportNATS)
	}
	return lb, nil
}

// brokerServer is the broker the stack runs on.
type brokerServer struct {
	// Config is how every function reaches it.
	Config instance.PubSub
	// Wakeup, when set, reports each publish (in-process pstest), for
	// the delivery loop.
	Wakeup *Wakeup
	// Started says what was started ("" when a running server was named).
	Started string
}

// brokerClient is the stack's own client of its broker.
type brokerClient struct {
	Broker broker.Broker
	// PubSub is the Pub/Sub client the delivery loop pulls with (nil on
	// another broker).
	PubSub *pubsub.Client
	// Pushes: the broker has push subscriptions (broker.PushConfigurer:
	// Pub/Sub), which the delivery loop stands in for, pausing and
	// resuming them for the operations API. A broker without push (NATS
	// JetStream) has its consumers pull (CONSUMER_MODE=pull, as in
	// production) and the rollup and DLQ-monitor subscriptions pulled by
	// bridges that POST what they pull.
	Pushes bool
}

// connectBroker opens the stack's client of its broker and provisions the
// topology's topics and subscriptions through the driver (streams and
// durable consumers on NATS).
func connectBroker(ctx context.Context, lb localBroker, cfg instance.PubSub, project string, top *topology.Topology, down *teardown) (brokerClient, error) {
	c, err := lb.connect(ctx, cfg, project)
	if err != nil {
		return brokerClient{}, err
	}
	down.push(func(context.Context) { _ = c.Broker.Close() })
	if err := c.Broker.Provision(ctx, top); err != nil {
		return brokerClient{}, fmt.Errorf("provision: %w", err)
	}
	_, c.Pushes = broker.As[broker.PushConfigurer](c.Broker)
	return c, nil
}

// pubsubLocal is Pub/Sub: PUBSUB_EMULATOR_HOST's, or in-process pstest
// behind the front internal/cmd/pstest serves too (pstestserver: its seek
// guard), with the delivery loop's wake-up.
type pubsubLocal struct{}

func (pubsubLocal) serve(_ context.Context, o Options, down *teardown) (brokerServer, error) {
	cfg := instance.PubSub{Transport: instance.TransportPubSub, EmulatorHost: o.PubSubHost}
	if cfg.EmulatorHost != "" {
		return brokerServer{Config: cfg}, nil
	}
	wake := NewWakeup()
	srv, err := pstestserver.Start("127.0.0.1:0", pstestserver.Options{Reactors: []pstest.ServerReactorOption{wake.Reactor()}})
	if err != nil {
		return brokerServer{}, fmt.Errorf("pstest: %w", err)
	}
	down.push(func(ctx context.Context) {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	cfg.EmulatorHost = srv.Addr
	return brokerServer{Config: cfg, Wakeup: wake, Started: "Pub/Sub     in-process pstest on " + srv.Addr}, nil
}

func (pubsubLocal) connect(ctx context.Context, cfg instance.PubSub, project string) (brokerClient, error) {
	c, err := brokeropen.PubSub(ctx, cfg, project)
	if err != nil {
		return brokerClient{}, err
	}
	return brokerClient{Broker: c, PubSub: c}, nil
}

// natsLocal is NATS JetStream: NATS_URL's server, or one embedded in the
// stack storing under <StateDir>/nats (see nats.go).
type natsLocal struct{}

func (natsLocal) serve(_ context.Context, o Options, down *teardown) (brokerServer, error) {
	cfg := instance.PubSub{Transport: instance.TransportNATS, NATSURL: o.NATSURL}
	if cfg.NATSURL != "" {
		return brokerServer{Config: cfg}, nil
	}
	dir := filepath.Join(o.StateDir, "nats")
	ns, err := startNATS(dir)
	if err != nil {
		return brokerServer{}, err
	}
	down.push(func(context.Context) { ns.Shutdown(); ns.WaitForShutdown() })
	cfg.NATSURL = ns.ClientURL()
	return brokerServer{Config: cfg, Started: "NATS        embedded JetStream server on " + cfg.NATSURL + " (store in " + dir + ")"}, nil
}

func (natsLocal) connect(ctx context.Context, cfg instance.PubSub, project string) (brokerClient, error) {
	b, err := brokeropen.Open(ctx, cfg, project)
	if err != nil {
		return brokerClient{}, err
	}
	return brokerClient{Broker: b}, nil
}
