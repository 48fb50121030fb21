package consume

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/relaybus/relaybus/internal/delivery"
	"github.com/relaybus/relaybus/internal/forwarders"
	"github.com/relaybus/relaybus/internal/inbox"
	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/internal/pull"
	"github.com/relaybus/relaybus/internal/pullengine"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/topology"
)

// forwarderPullers is the forwarders service in pull mode
// (CONSUMER_HANDLER=forwarders with CONSUMER_MODE=pull: NATS JetStream,
// which pushes nothing). It runs one pull worker (internal/pull) per
// forwarder of the registry, pulling the forwarder's subscription (the
// durable consumer the operators' API created) into the forwarder's own
// engine, the one push delivers to: each delivery takes the forwarder's
// entry as a pushed one does (forwarderSet.entry: the row read again once
// older than the refresh, a new engine from a new revision), so a changed
// URL, auth or timeout serves the next delivery after the refresh, with
// the forwarder's inbox, attempts, ledger, breaker, flow limits and pause.
// So a forwarder has what a declared consumer's pull worker has: one
// message in flight per ordering key, the acknowledgement only after the
// engine answered (the forward succeeded, or failed for good and was
// recorded), the topology's backoff and its dead letter to <topic>.dlq
// after max_delivery_attempts, and a drain at shutdown.
//
// The registry is listed every refresh (no more often than every
// minForwardersListEvery): a forwarder added gets a worker; one removed
// has its worker drained; one whose maxInFlight changed, or that was
// removed and added again between two listings, has its worker drained
// and then started again (never two at once on one subscription: two
// would each hold a message of one key). A registry
// that cannot be listed leaves the workers as they are until it can.
type forwarderPullers struct {
	set   *forwarderSet
	top   *topology.Topology
	every time.Duration
	// base are the workers' shared options (Source, DeadLetters, Project,
	// MaxInFlight, Logger); each forwarder adds its own.
	base pull.Options

	stop context.CancelFunc
	done chan struct{}

	// running is the workers by forwarder name, touched by the loop only.
	running map[string]*forwarderPuller
}

// minForwardersListEvery is the shortest interval between two listings of
// the registry, whatever the refresh.
const minForwardersListEvery = 50 * time.Millisecond

// forwarderPuller is one forwarder's running worker.
type forwarderPuller struct {
	// maxInFlight is the forwarder's maxInFlight the worker was started
	// with, created its row's creation (a forwarder removed and added
	// again between two listings gets a worker of its own).
	maxInFlight int
	created     time.Time
	stop        context.CancelFunc
	done        chan error
}

// startForwarderPullers starts pulling every forwarder of set's registry,
// and keeps doing so until Close.
func startForwarderPullers(ctx context.Context, set *forwarderSet, top *topology.Topology, base pull.Options) *forwarderPullers {
	lctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	p := &forwarderPullers{set: set, top: top, every: max(set.refresh, minForwardersListEvery), base: base, stop: stop,
		done: make(chan struct{}), running: map[string]*forwarderPuller{}}
	go p.run(lctx)
	return p
}

func (p *forwarderPullers) run(ctx context.Context) {
	defer close(p.done)
	t := time.NewTicker(p.every)
	defer t.Stop()
	failing := false
	for {
		err := p.sync(ctx)
		switch {
		case err != nil && !failing && ctx.Err() == nil:
			p.set.fwd.Logger.WarnContext(ctx, "consume: cannot list the forwarders; their workers run as they are until it can",
				"error", err.Error())
		case err == nil && failing:
			p.set.fwd.Logger.InfoContext(ctx, "consume: the forwarders' registry is readable again")
		}
		failing = err != nil
		select {
		case <-ctx.Done():
			p.halt(runningNames(p.running)...)
			return
		case <-t.C:
		}
	}
}

func runningNames(m map[string]*forwarderPuller) []string {
	out := make([]string, 0, len(m))
	for n := range m {
		out = append(out, n)
	}
	return out
}

// sync makes the running workers those of the registry's forwarders.
func (p *forwarderPullers) sync(ctx context.Context) error {
	fs, err := forwarders.List(ctx, p.set.db)
	if err != nil {
		return err
	}
	listed := make(map[string]forwarders.Forwarder, len(fs))
	for _, f := range fs {
		listed[f.Name] = f
	}
	var halt []string
	for name, r := range p.running {
		f, ok := listed[name]
		stopped := false
		select {
		case err := <-r.done: // stopped on its own: started again below
			r.done <- err
			stopped = true
		default:
		}
		if !ok || stopped || f.MaxInFlight != r.maxInFlight || !f.CreatedAt.Equal(r.created) {
			halt = append(halt, name)
		}
	}
	p.halt(halt...)
	for _, name := range halt {
		if _, ok := listed[name]; !ok {
			p.set.forget(name)
			p.set.fwd.Logger.InfoContext(ctx, "consume: stopped pulling a removed forwarder", "forwarder", name)
		}
	}
	for _, f := range fs {
		if _, ok := p.running[f.Name]; ok || ctx.Err() != nil {
			continue
		}
		if err := p.start(ctx, f); err != nil {
			// Tried again at the next listing.
			p.set.fwd.Logger.WarnContext(ctx, "consume: cannot pull a forwarder", "forwarder", f.Name, "error", err.Error())
		}
	}
	return nil
}

// start starts f's worker.
func (p *forwarderPullers) start(ctx context.Context, f forwarders.Forwarder) error {
	secs := func(s int) time.Duration { return time.Duration(s) * time.Second }
	c := f.Consumer(p.top)
	o := p.base
	o.Subscription = f.Subscription()
	o.Engine = forwarderEngine{set: p.set, name: f.Name}
	o.Paused = pullengine.Paused(&inbox.PauseFlags{DB: p.set.db, ConsumerID: f.Name, Every: p.set.pauseEvery}, f.Topic)
	o.MaxAttempts = c.MaxDeliveryAttempts
	o.MinBackoff, o.MaxBackoff, o.ExtendEvery = secs(c.MinBackoffSeconds), secs(c.MaxBackoffSeconds), secs(c.AckDeadlineSeconds)/3
	if f.MaxInFlight > 0 && (o.MaxInFlight <= 0 || f.MaxInFlight < o.MaxInFlight) {
		o.MaxInFlight = f.MaxInFlight
	}
	w, err := pull.New(o)
	if err != nil {
		return err
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	p.running[f.Name] = &forwarderPuller{maxInFlight: f.MaxInFlight, created: f.CreatedAt, stop: stop, done: done}
	p.set.fwd.Logger.InfoContext(ctx, "consume: pulling forwarder", "forwarder", f.Name, "subscription", o.Subscription)
	return nil
}

// halt drains the named workers at once: their deliveries in flight
// finish and are acknowledged, the rest is handed back.
func (p *forwarderPullers) halt(names ...string) {
	for _, n := range names {
		p.running[n].stop()
	}
	for _, n := range names {
		if err := <-p.running[n].done; err != nil {
			p.set.fwd.Logger.Warn("consume: a forwarder's pull worker stopped", "forwarder", n, "error", err.Error())
		}
		delete(p.running, n)
	}
}

// Close drains every worker within ctx.
func (p *forwarderPullers) Close(ctx context.Context) error {
	p.stop()
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("consume: the forwarders' pull workers still draining at shutdown: %w", ctx.Err())
	}
}

// forwarderEngine is a forwarder's pull worker's engine: each delivery
// goes to the forwarder's entry as a pushed one does (ServeHTTP), through
// the pause and the flow-control gate as a declared consumer's pulled
// delivery does (pullEngine).
type forwarderEngine struct {
	set  *forwarderSet
	name string
}

// heldForRegistry is how long a delivery waits, held, when the
// forwarder's registry row cannot be read.
const heldForRegistry = time.Second

func (fe forwarderEngine) Handle(ctx context.Context, d delivery.Delivery) pull.Answer {
	id := d.Message.Attributes[event.AttrEventID]
	e, err := fe.set.entry(ctx, fe.name)
	switch {
	case errors.Is(err, forwarders.ErrNotFound):
		// Removed since it was pulled: acknowledged, as push does.
		return pull.Answer{Status: http.StatusOK, Code: CodeUnknownForwarder, EventID: id, Error: "no forwarder is named " + fe.name + ": it was removed"}
	case err != nil:
		// Its row unreadable, its settings refused, or the service
		// stopping: held, no attempt counted (the registry is not the
		// target's fault).
		return pull.Answer{Status: http.StatusServiceUnavailable, Code: "unavailable", EventID: id, Error: err.Error(),
			Held: true, RetryAfter: heldForRegistry}
	}
	defer e.busy.Done()
	return pullEngine{pullengine.New(e.engine, e.h.pauses), e.h.gate}.Handle(ctx, d)
}

// forget drops a removed forwarder's entry; its engine closes once its
// deliveries are done.
func (s *forwarderSet) forget(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.entries[name]; e != nil {
		delete(s.entries, name)
		s.retire(e)
	}
}

// forwardersMode checks the forwarders service's CONSUMER_MODE against
// its transport: on Pub/Sub each forwarder's subscription pushes to it
// (push); on NATS JetStream, which pushes nothing, it pulls each one
// (pull).
func forwardersMode(cfg Config) error {
	nats := cfg.PubSub.Transport == instance.TransportNATS
	switch {
	case cfg.Mode == ModePull && !nats:
		return fmt.Errorf("config: CONSUMER_HANDLER=%s with CONSUMER_MODE=pull needs TRANSPORT=nats: on Pub/Sub the operations API gives each forwarder a subscription that pushes to this service (CONSUMER_MODE=push)", HandlerForwarders)
	case cfg.Mode != ModePull && nats:
		return fmt.Errorf("config: CONSUMER_HANDLER=%s on TRANSPORT=nats needs CONSUMER_MODE=pull: JetStream pushes nothing, so this service pulls each forwarder's durable consumer", HandlerForwarders)
	}
	return nil
}
