package devstack

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/relaybus/relaybus/internal/deadletter"
	"github.com/relaybus/relaybus/internal/delivery"
	"github.com/relaybus/relaybus/internal/names"
	"github.com/relaybus/relaybus/internal/retry"
	"github.com/relaybus/relaybus/shared/broker/pubsub"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/topology"
)

// Route is one subscription the delivery loop serves: where it POSTs and
// in which shape.
type Route struct {
	// Subscription is the subscription id.
	Subscription string
	// Topic is the subscription's topic.
	Topic string
	// URL receives the requests.
	URL string
	// Mode is topology.DeliveryPush (wrapped push body with deliveryAttempt,
	// one message in flight per ordering key, in order) or
	// topology.DeliveryEventarc (binary messagePublished CloudEvent,
	// unordered).
	Mode string
	// MinBackoff and MaxBackoff space redeliveries of a refused message:
	// the n-th redelivery waits MinBackoff·2^(n-1), lengthened by up to 20%
	// jitter, at most MaxBackoff (retry.Policy with NoShorter: Pub/Sub's
	// minimum_backoff is a minimum). Zero
	// takes the subscription's own retry policy, multiplied by
	// Loop.BackoffScale (a subscription without one is redelivered after
	// NoPolicyBackoff, as Pub/Sub redelivers it "as soon as possible").
	MinBackoff, MaxBackoff time.Duration
	// MaxAttempts dead-letters a message to <Topic>.dlq after this many
	// refused deliveries (0 never does).
	MaxAttempts int
	// MaxInFlight bounds this route's deliveries in flight (0:
	// Loop.MaxInFlight); its held messages are at least as many. An
	// endpoint that holds its requests by design (rollup gathers an
	// event's consumers for up to its window) needs more than a consumer.
	MaxInFlight int
}

// NoPolicyBackoff is the pause before redelivering a message of a
// subscription that has no retry policy.
const NoPolicyBackoff = 100 * time.Millisecond

// The loop's own retries (retry.Policy, ±20% jitter): reading a route's
// subscription at start (200 ms doubling to 5 s, until it succeeds or the
// loop stops), a failed pull (50 ms doubling to 2 s, from the start again
// after a pull that succeeds), and a failed acknowledgement (100, 200,
// 400 ms, three tries before the lease is left to lapse).
var (
	setupBackoff = retry.Policy{Initial: 200 * time.Millisecond, Max: 5 * time.Second}
	pullBackoff  = retry.Policy{Initial: 50 * time.Millisecond, Max: 2 * time.Second}
	ackBackoff   = retry.Policy{Initial: 100 * time.Millisecond, Max: 400 * time.Millisecond}
)

// Loop stands in for Eventarc and push subscriptions. For each route it
// pulls the subscription with unary Pull calls and POSTs every message in
// the route's exact request shape (internal/delivery's builders):
//
//   - push routes keep one message in flight per ordering key, in publish
//     order; a refused message (any answer but 102, 200, 201, 202, 204, as
//     push counts them, or no answer within the subscription's ack
//     deadline) holds its key for the subscription's backoff, then it and
//     every later message of the key are delivered in order, as Pub/Sub's
//     ordered redelivery does;
//   - Eventarc routes deliver without regard to keys; a refused message
//     comes back after its backoff;
//   - after the route's maximum attempts a message is published to
//     <topic>.dlq with Pub/Sub's own dead-letter attributes
//     (deadletter.PubSub) and acknowledged (pstest's dead-lettering does
//     not work, and neither fake pushes);
//   - the subscription's filter is applied (the gcloud emulator ignores
//     filters): a message it refuses is acknowledged undelivered.
//
// The loop holds what it pulled under a short lease (Lease) that it extends
// while the message waits or is being delivered, so messages held by a
// process that died come back within a lease, not after the subscription's
// ack deadline. It never holds more than MaxOutstanding messages per route
// nor runs more than MaxInFlight deliveries per route: a slow endpoint
// slows pulling, it never blocks the Pub/Sub server (unlike StreamingPull
// against pstest, whose server-wide mutex waits on a client that stopped
// reading).
type Loop struct {
	// Client pulls the subscriptions and publishes dead letters.
	Client *pubsub.Client
	// Project is the project named in subscription paths and dead-letter
	// attributes.
	Project string
	// HTTP posts the deliveries (nil: keep-alive connections). Each
	// delivery is bounded by its subscription's ack deadline.
	HTTP *http.Client
	// BackoffScale multiplies backoffs taken from subscriptions' retry
	// policies (0 means 1: Pub/Sub's timing).
	BackoffScale float64
	// MaxInFlight bounds the deliveries in flight per route (64).
	MaxInFlight int
	// MaxOutstanding bounds the messages a route holds: pulled and not yet
	// acknowledged or handed back, whether queued behind their key,
	// waiting out a backoff or in flight (1000).
	MaxOutstanding int
	// Lease is the ack deadline the loop keeps on the messages it holds,
	// renewed every Lease/3 (10 s).
	Lease time.Duration
	// Wakeup, when set, reports publishes (in-process pstest's reactor): the
	// loop pulls with ReturnImmediately when woken, after each
	// acknowledgement and at least every Poll. Without it the loop
	// long-polls (Pull without ReturnImmediately), which the gcloud
	// emulator answers as soon as a message arrives. An in-process server
	// dies with the loop, so with Wakeup set the loop does not lease
	// messages the moment it pulls them (every RPC costs pstest a turn of
	// its one lock); it still renews every Lease/3.
	Wakeup *Wakeup
	// Poll is the idle pull interval when Wakeup is set (100 ms): it covers
	// what no publish announces (a lapsed lease, a seek).
	Poll time.Duration
	// ShutdownTimeout bounds Run's return after ctx ends (10 s): in-flight
	// deliveries get until then to finish, less a short reserve in which
	// whatever is still held is handed back to its subscription.
	ShutdownTimeout time.Duration
	// Logger receives one line per refused delivery and dead letter.
	Logger *slog.Logger

	// abandon makes Run stop as a killed process would (tests): nothing
	// more reaches Pub/Sub, not even the hand-back.
	abandon bool
	// admitted, when set, is told how many messages a route holds after
	// each pull it admitted (tests).
	admitted func(sub string, held int)

	pauseMu sync.Mutex
	// paused holds the paused subscriptions, each with a channel closed
	// when it resumes.
	paused map[string]chan struct{}

	// runMu guards running and pending: the routes added while Run runs
	// (Add, Remove), and those added before it starts.
	runMu   sync.Mutex
	running *loopRun
	pending []Route
}

// loopRun is a running Run's state, for the routes added while it runs.
type loopRun struct {
	ctx, cutCtx, endCtx context.Context
	wg                  *sync.WaitGroup
	runners             []*runner
	stops               map[string]context.CancelFunc
}

// start runs a runner for r until ctx ends or Remove stops it (with
// l.runMu held).
func (l *Loop) start(lr *loopRun, r Route) {
	if _, ok := lr.stops[r.Subscription]; ok {
		return
	}
	ctx, stop := context.WithCancel(lr.ctx)
	lr.stops[r.Subscription] = stop
	rn := &runner{l: l, r: r}
	lr.runners = append(lr.runners, rn)
	lr.wg.Add(1)
	go func() {
		defer lr.wg.Done()
		rn.run(ctx, lr.cutCtx, lr.endCtx)
	}()
}

// Add starts delivering a route the loop did not have (a subscription
// created while the stack runs: a forwarder added through the operations
// API); before Run it is delivered from Run's start. A route the loop has
// is left as it is.
func (l *Loop) Add(r Route) {
	l.runMu.Lock()
	defer l.runMu.Unlock()
	if l.running == nil {
		l.pending = append(l.pending, r)
		return
	}
	l.start(l.running, r)
}

// Remove stops delivering sub (its subscription is being deleted): what
// the loop holds of it is handed back, as at shutdown.
func (l *Loop) Remove(sub string) {
	l.runMu.Lock()
	defer l.runMu.Unlock()
	if l.running == nil {
		l.pending = slices.DeleteFunc(l.pending, func(r Route) bool { return r.Subscription == sub })
		return
	}
	if stop, ok := l.running.stops[sub]; ok {
		stop()
		delete(l.running.stops, sub)
	}
}

// Pause stops delivery on a subscription, as detaching a push
// subscription's endpoint does on Google Cloud: nothing more is pulled or
// delivered (what the loop holds stays held, under its lease), so no
// delivery attempt is counted and nothing is dead-lettered; messages wait
// in the subscription until Resume. It reports whether it changed anything.
// The context is not used (the dlqreplay.Pauser contract).
func (l *Loop) Pause(_ context.Context, sub string) (bool, error) {
	l.pauseMu.Lock()
	defer l.pauseMu.Unlock()
	if _, ok := l.paused[sub]; ok {
		return false, nil
	}
	if l.paused == nil {
		l.paused = map[string]chan struct{}{}
	}
	l.paused[sub] = make(chan struct{})
	return true, nil
}

// Resume restarts delivery on a paused subscription, oldest message first.
func (l *Loop) Resume(_ context.Context, sub string) (bool, error) {
	l.pauseMu.Lock()
	defer l.pauseMu.Unlock()
	ch, ok := l.paused[sub]
	if !ok {
		return false, nil
	}
	delete(l.paused, sub)
	close(ch)
	return true, nil
}

// Paused reports whether a subscription is paused.
func (l *Loop) Paused(_ context.Context, sub string) (bool, error) {
	l.pauseMu.Lock()
	defer l.pauseMu.Unlock()
	_, ok := l.paused[sub]
	return ok, nil
}

// whilePaused waits until sub is not paused, or ctx ends (false).
func (l *Loop) whilePaused(ctx context.Context, sub string) bool {
	for {
		l.pauseMu.Lock()
		ch, ok := l.paused[sub]
		l.pauseMu.Unlock()
		if !ok {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-ch:
		}
	}
}

// Stopped is what Run handed back to Pub/Sub when it stopped: messages
// pulled but not acknowledged, nacked so that they are redelivered at once.
type Stopped struct {
	// HandedBack counts them all, by subscription id in BySubscription.
	HandedBack     int
	BySubscription map[string]int
	// Cut counts the deliveries still in flight at the shutdown timeout,
	// aborted and handed back (included in HandedBack, or in Lapsing when
	// the hand-back failed).
	Cut int
	// Lapsing counts messages the loop could not hand back (the server did
	// not answer in time): they return when their lease lapses.
	Lapsing int
}

// String says what was handed back, per subscription, in one line.
func (s Stopped) String() string {
	if s.HandedBack == 0 && s.Lapsing == 0 {
		return "local delivery: stopped; nothing held"
	}
	subs := make([]string, 0, len(s.BySubscription))
	for k, v := range s.BySubscription {
		subs = append(subs, fmt.Sprintf("%s %d", k, v))
	}
	sort.Strings(subs)
	out := fmt.Sprintf("local delivery: stopped; handed %d messages back to their subscriptions (%d cut off in flight at the shutdown timeout)",
		s.HandedBack, s.Cut)
	if len(subs) > 0 {
		out += ": " + strings.Join(subs, ", ")
	}
	if s.Lapsing > 0 {
		out += fmt.Sprintf("; %d could not be handed back and return when their lease lapses", s.Lapsing)
	}
	return out
}

func (l *Loop) defaults() {
	if l.HTTP == nil {
		l.HTTP = &http.Client{Transport: &http.Transport{
			MaxIdleConns: 1024, MaxIdleConnsPerHost: 1024, IdleConnTimeout: 90 * time.Second}}
	}
	if l.Logger == nil {
		l.Logger = slog.New(slog.DiscardHandler)
	}
	if l.BackoffScale <= 0 {
		l.BackoffScale = 1
	}
	if l.MaxInFlight <= 0 {
		l.MaxInFlight = 64
	}
	if l.MaxOutstanding <= 0 {
		l.MaxOutstanding = 1000
	}
	l.MaxOutstanding = max(l.MaxOutstanding, l.MaxInFlight)
	if l.Lease <= 0 {
		l.Lease = 10 * time.Second
	}
	if l.Poll <= 0 {
		l.Poll = 100 * time.Millisecond
	}
	if l.ShutdownTimeout <= 0 {
		l.ShutdownTimeout = 10 * time.Second
	}
}

// Run serves routes until ctx ends. Then it stops pulling, lets the
// deliveries in flight finish until ShutdownTimeout (less a reserve of a
// quarter, at most 2 s), aborts those still running, and hands every
// message it still holds back to its subscription (queued, waiting out a
// backoff, or cut off), in per-key order. It returns within
// ShutdownTimeout, whatever the load, and says what it handed back.
func (l *Loop) Run(ctx context.Context, routes []Route) Stopped {
	l.defaults()
	reserve := min(l.ShutdownTimeout/4, 2*time.Second)
	cutCtx, cut := context.WithCancel(context.WithoutCancel(ctx))
	endCtx, end := context.WithCancel(context.WithoutCancel(ctx))
	defer cut()
	defer end()
	var wg sync.WaitGroup
	lr := &loopRun{ctx: ctx, cutCtx: cutCtx, endCtx: endCtx, wg: &wg, stops: map[string]context.CancelFunc{}}
	l.runMu.Lock()
	for _, r := range append(slices.Clone(routes), l.pending...) {
		l.start(lr, r)
	}
	l.pending, l.running = nil, lr
	l.runMu.Unlock()
	<-ctx.Done()
	l.runMu.Lock()
	l.running = nil
	runners := lr.runners
	l.runMu.Unlock()
	if l.abandon {
		cut()
		end()
	}
	t1 := time.AfterFunc(l.ShutdownTimeout-reserve, cut)
	t2 := time.AfterFunc(l.ShutdownTimeout, end)
	wg.Wait()
	t1.Stop()
	t2.Stop()
	st := Stopped{BySubscription: map[string]int{}}
	for _, r := range runners {
		if r.handedBack > 0 {
			st.BySubscription[r.r.Subscription] = r.handedBack
			st.HandedBack += r.handedBack
		}
		st.Cut += r.cut
		st.Lapsing += r.lapsing
	}
	if st.HandedBack > 0 || st.Lapsing > 0 {
		l.Logger.Warn(st.String())
	} else {
		l.Logger.Info(st.String())
	}
	return st
}

func (l *Loop) path(sub string) string {
	return fmt.Sprintf("projects/%s/subscriptions/%s", l.Project, sub)
}

// state of a held message.
type heldState uint8

const (
	queued   heldState = iota // waiting for a worker (in ready) or behind its key's head
	inFlight                  // being delivered
	backingOff
	settling // acknowledged or dead-lettered: its ack is on the way
	cutOff   // aborted at the shutdown timeout
)

// held is a message the loop pulled and has not settled.
type held struct {
	id    string
	ackID string
	msg   event.Message
	key   string // the ordering key the route serializes on ("" none)
	seq   uint64 // arrival order
	n     int    // deliveries so far
	state heldState
	// leaseEnd is when the server may hand the message out again unless
	// the loop extends its lease.
	leaseEnd time.Time
}

// ackers is how many Acknowledge calls a route keeps going at once (the
// emulator takes about a millisecond per ack id).
const ackers = 4

// runner serves one route.
type runner struct {
	l   *Loop
	r   Route
	sub string // full path

	ackDeadline time.Duration
	filter      filter
	ordered     bool
	// inFlight and outstanding are the route's bounds: Route.MaxInFlight
	// or the loop's, and the loop's MaxOutstanding, at least inFlight.
	inFlight, outstanding int

	mu       sync.Mutex
	held     map[string]*held
	keys     map[string][]*held // per ordering key: the active head first, then the waiting ones in order
	fresh    []*held            // pulled and not yet leased
	stopping bool
	seq      uint64

	ready chan *held    // queued messages a worker may take; never more than outstanding
	acks  chan *held    // settled messages to acknowledge
	space chan struct{} // the held set shrank
	kick  chan struct{} // an ack went through: an ordered server may hand out a key's next message
	lease chan struct{} // fresh messages to lease

	handedBack, cut, lapsing int
}

func (r *runner) signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// setup reads the subscription: retry policy (unless the route sets a
// backoff), ack deadline and filter.
func (r *runner) setup(ctx context.Context) error {
	s, err := r.l.Client.PubSub().SubscriptionAdminClient.GetSubscription(ctx,
		&pb.GetSubscriptionRequest{Subscription: r.sub})
	if err != nil {
		return fmt.Errorf("subscription %s: %w", r.r.Subscription, err)
	}
	r.ackDeadline = time.Duration(s.GetAckDeadlineSeconds()) * time.Second
	if r.ackDeadline <= 0 {
		r.ackDeadline = 10 * time.Second // Pub/Sub's default
	}
	if f, err := parseFilter(s.GetFilter()); err != nil {
		r.l.Logger.Warn("local delivery: cannot apply the subscription's filter; delivering everything (consume still skips messages for other consumers)",
			"subscription", r.r.Subscription, "error", err.Error())
	} else {
		r.filter = f
	}
	if r.r.MinBackoff > 0 {
		r.r.MaxBackoff = max(r.r.MaxBackoff, r.r.MinBackoff)
		return nil
	}
	rp := s.GetRetryPolicy()
	if rp == nil {
		r.r.MinBackoff, r.r.MaxBackoff = NoPolicyBackoff, NoPolicyBackoff
		return nil
	}
	// Pub/Sub's defaults for a retry policy that leaves a bound out.
	lo, hi := 10*time.Second, 600*time.Second
	if d := rp.GetMinimumBackoff(); d != nil {
		lo = d.AsDuration()
	}
	if d := rp.GetMaximumBackoff(); d != nil {
		hi = d.AsDuration()
	}
	r.r.MinBackoff = time.Duration(float64(lo) * r.l.BackoffScale)
	r.r.MaxBackoff = max(time.Duration(float64(hi)*r.l.BackoffScale), r.r.MinBackoff)
	return nil
}

// run serves the route until ctx ends, then shuts down as Run says:
// cutCtx aborts in-flight deliveries, endCtx bounds the final RPCs.
func (r *runner) run(ctx, cutCtx, endCtx context.Context) {
	l := r.l
	r.sub = l.path(r.r.Subscription)
	r.ordered = r.r.Mode != topology.DeliveryEventarc
	r.inFlight = l.MaxInFlight
	if r.r.MaxInFlight > 0 {
		r.inFlight = r.r.MaxInFlight
	}
	r.outstanding = max(l.MaxOutstanding, r.inFlight)
	setupRetry := setupBackoff.Backoff()
	for {
		err := r.setup(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return
		}
		wait := setupRetry.Next()
		l.Logger.Warn("local delivery: cannot read the subscription; retrying", "subscription", r.r.Subscription, "error", err.Error(),
			"retry_in", wait.String())
		if retry.Sleep(ctx, wait) != nil {
			return
		}
	}
	r.held = map[string]*held{}
	r.keys = map[string][]*held{}
	r.ready = make(chan *held, r.outstanding)
	r.acks = make(chan *held, r.outstanding)
	r.space = make(chan struct{}, 1)
	r.kick = make(chan struct{}, 1)
	r.lease = make(chan struct{}, 1)

	leaseCtx, stopLeasing := context.WithCancel(context.WithoutCancel(ctx))
	var pulling, working, acking, leasing sync.WaitGroup
	pulling.Add(1)
	go func() { defer pulling.Done(); r.pull(ctx, endCtx) }()
	for range r.inFlight {
		working.Add(1)
		go func() { defer working.Done(); r.work(ctx, cutCtx) }()
	}
	for range ackers {
		acking.Add(1)
		go func() { defer acking.Done(); r.ack(endCtx) }()
	}
	leasing.Add(1)
	go func() { defer leasing.Done(); r.keepLeases(leaseCtx) }()

	<-ctx.Done()
	r.mu.Lock()
	r.stopping = true // nothing new starts; what arrives from here on is handed back
	r.mu.Unlock()
	pulling.Wait()
	working.Wait()
	close(r.acks)
	acking.Wait()
	stopLeasing()
	leasing.Wait()
	r.handBack(endCtx)
}

// pull fetches messages while the route has room, until ctx ends; endCtx
// bounds the last Pull.
func (r *runner) pull(ctx, endCtx context.Context) {
	l := r.l
	var wake <-chan struct{}
	if l.Wakeup != nil {
		topic := "projects/" + l.Project + "/topics/" + names.ResourceID(r.r.Topic)
		wake = l.Wakeup.listen(topic)
		defer l.Wakeup.unlisten(topic, wake)
	}
	subs := l.Client.PubSub().SubscriptionAdminClient
	var lastErr time.Time
	pullRetry := pullBackoff.Backoff()
	for {
		r.mu.Lock()
		n := len(r.held)
		r.mu.Unlock()
		free := r.outstanding - n
		if ctx.Err() != nil || !l.whilePaused(ctx, r.r.Subscription) {
			return
		}
		// Each Pull costs the server a scan of the subscription's backlog
		// (pstest, under its one lock): with messages at hand, wait until
		// there is room for a worthwhile batch.
		if free <= 0 || n > 0 && free < min(100, r.outstanding/10) {
			select {
			case <-ctx.Done():
				return
			case <-r.space:
			}
			continue
		}
		want := min(free, 1000)
		// The pull is not cut short by ctx (only by the shutdown timeout):
		// a cancelled Pull may already have handed messages out, which
		// would then wait out the subscription's ack deadline. A long poll
		// is bounded instead (the emulator answers empty a second before
		// the deadline), and what it brings after ctx ended is handed back.
		var (
			resp *pb.PullResponse
			err  error
		)
		if wake != nil {
			pctx, cancel := context.WithTimeout(endCtx, 10*time.Second)
			resp, err = subs.Pull(pctx, &pb.PullRequest{Subscription: r.sub, MaxMessages: int32(want), ReturnImmediately: true})
			cancel()
		} else {
			pctx, cancel := context.WithTimeout(endCtx, 3*time.Second)
			resp, err = subs.Pull(pctx, &pb.PullRequest{Subscription: r.sub, MaxMessages: int32(want)})
			cancel()
			if status.Code(err) == codes.DeadlineExceeded {
				err = nil
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if time.Since(lastErr) > 10*time.Second {
				l.Logger.Warn("local delivery: pull failed; retrying", "subscription", r.r.Subscription, "error", err.Error())
			}
			lastErr = time.Now()
			if retry.Sleep(ctx, pullRetry.Next()) != nil {
				return
			}
			continue
		}
		pullRetry.Reset()
		got := resp.GetReceivedMessages()
		r.admit(got)
		if len(got) >= want || wake == nil {
			continue
		}
		t := time.NewTimer(l.Poll)
		select {
		case <-ctx.Done():
		case <-wake:
		case <-r.kick:
		case <-t.C:
		}
		t.Stop()
	}
}

// admit takes pulled messages into the held set and queues them.
func (r *runner) admit(msgs []*pb.ReceivedMessage) {
	if len(msgs) == 0 {
		return
	}
	var drop []*held
	now := time.Now()
	r.mu.Lock()
	leaseNow := r.l.Wakeup == nil // see Loop.Wakeup
	for _, rm := range msgs {
		pm := rm.GetMessage()
		id := pm.GetMessageId()
		if h, ok := r.held[id]; ok {
			// Redelivered while held (a lease lapsed): the new ack id is the
			// one the server accepts; the message is not queued twice.
			h.ackID = rm.GetAckId()
			h.leaseEnd = now.Add(r.ackDeadline)
			if leaseNow {
				r.fresh = append(r.fresh, h)
			}
			continue
		}
		r.seq++
		h := &held{id: id, ackID: rm.GetAckId(), seq: r.seq, msg: event.Message{
			ID: id, Data: pm.GetData(), Attributes: pm.GetAttributes(), OrderingKey: pm.GetOrderingKey(),
			PublishTime: pm.GetPublishTime().AsTime(), Topic: r.r.Topic,
		}}
		if h.msg.Attributes == nil {
			h.msg.Attributes = map[string]string{}
		}
		r.held[id] = h
		h.leaseEnd = now.Add(r.ackDeadline)
		if r.filter != nil && !r.filter.match(h.msg.Attributes) {
			h.state = settling // filtered out: acknowledged, never delivered
			drop = append(drop, h)
			continue
		}
		if leaseNow {
			r.fresh = append(r.fresh, h)
		}
		if r.ordered && h.msg.OrderingKey != "" {
			h.key = h.msg.OrderingKey
			q := r.keys[h.key]
			// In publish order behind the active head (the emulator hands out
			// a key's messages in order, but redeliveries may come late).
			i := len(q)
			for i > 1 && q[i-1].msg.PublishTime.After(h.msg.PublishTime) {
				i--
			}
			q = slices.Insert(q, i, h)
			r.keys[h.key] = q
			if len(q) > 1 {
				continue // waits behind its key's head
			}
		}
		r.queue(h)
	}
	held := len(r.held)
	r.mu.Unlock()
	if r.l.admitted != nil {
		r.l.admitted(r.r.Subscription, held)
	}
	for _, h := range drop {
		r.acks <- h
	}
	if leaseNow {
		r.signal(r.lease)
	}
}

// queue hands h to the workers unless the loop is stopping (then h stays
// held and is handed back). Called with r.mu held.
func (r *runner) queue(h *held) {
	h.state = queued
	if r.stopping {
		return
	}
	r.ready <- h // never blocks: at most MaxOutstanding are held
}

// work delivers queued messages until ctx ends.
func (r *runner) work(ctx, cutCtx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case h := <-r.ready:
			if !r.l.whilePaused(ctx, r.r.Subscription) { // paused: h waits, no attempt counted
				return
			}
			r.mu.Lock()
			if r.stopping { // h stays queued and is handed back
				r.mu.Unlock()
				return
			}
			if h.state != queued {
				r.mu.Unlock()
				continue
			}
			h.state = inFlight
			h.n++
			n := h.n
			r.mu.Unlock()
			r.deliver(cutCtx, h, n)
		}
	}
}

// deliver makes delivery attempt n of h and settles the outcome.
func (r *runner) deliver(cutCtx context.Context, h *held, n int) {
	l, rt := r.l, r.r
	msg := h.msg
	msg.DeliveryAttempt = n
	if rt.MaxAttempts == 0 || n <= rt.MaxAttempts {
		code, err := r.post(cutCtx, msg, n)
		if err == nil && acked(code) {
			r.settle(h)
			return
		}
		if cutCtx.Err() != nil {
			r.mu.Lock()
			h.state = cutOff
			r.mu.Unlock()
			return
		}
		l.Logger.Debug("local delivery: refused", "subscription", rt.Subscription, "message_id", h.id,
			"ordering_key", msg.OrderingKey, "delivery_attempt", n, "status", code, "error", errText(err))
	}
	if rt.MaxAttempts > 0 && n >= rt.MaxAttempts {
		dlq := names.DeadLetter(rt.Topic)
		dl := deadletter.PubSub(msg, l.Project, r.sub, min(n, rt.MaxAttempts))
		pctx, cancel := context.WithTimeout(cutCtx, 30*time.Second)
		_, err := l.Client.Publish(pctx, dlq, dl)
		cancel()
		if err == nil {
			l.Logger.Warn("local delivery: dead-lettered after max delivery attempts", "subscription", rt.Subscription,
				"message_id", h.id, "ordering_key", msg.OrderingKey, "attempts", rt.MaxAttempts, "dead_letter_topic", dlq)
			r.settle(h)
			return
		}
		l.Logger.Error("local delivery: cannot dead-letter; will retry", "subscription", rt.Subscription,
			"message_id", h.id, "dead_letter_topic", dlq, "error", err.Error())
	}
	// Hold the key for the backoff, as Pub/Sub's retry policy does, then
	// deliver the message again (the key's later messages wait behind it).
	d := retry.Policy{Initial: rt.MinBackoff, Max: rt.MaxBackoff, NoShorter: true}.Delay(n)
	r.mu.Lock()
	h.state = backingOff
	r.mu.Unlock()
	time.AfterFunc(d, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if h.state == backingOff {
			r.queue(h)
		}
	})
}

// settle releases h's key to its next message and sends h to be
// acknowledged.
func (r *runner) settle(h *held) {
	r.mu.Lock()
	h.state = settling
	if h.key != "" {
		q := r.keys[h.key]
		if len(q) > 0 && q[0] == h {
			q = q[1:]
		} else if i := slices.Index(q, h); i >= 0 {
			q = slices.Delete(q, i, i+1)
		}
		if len(q) == 0 {
			delete(r.keys, h.key)
		} else {
			r.keys[h.key] = q
			if q[0].state == queued {
				r.queue(q[0])
			}
		}
	}
	r.mu.Unlock()
	r.acks <- h // never blocks: at most MaxOutstanding are held
}

// ack acknowledges settled messages in batches until r.acks is closed.
func (r *runner) ack(endCtx context.Context) {
	subs := r.l.Client.PubSub().SubscriptionAdminClient
	batch := make([]*held, 0, 1000)
	for h := range r.acks {
		batch = append(batch[:0], h)
	drain:
		for len(batch) < 1000 {
			select {
			case h, ok := <-r.acks:
				if !ok {
					break drain
				}
				batch = append(batch, h)
			default:
				break drain
			}
		}
		ids := make([]string, len(batch))
		r.mu.Lock()
		for i, h := range batch {
			ids[i] = h.ackID
		}
		r.mu.Unlock()
		var err error
		for try := range 3 {
			actx, cancel := context.WithTimeout(endCtx, 10*time.Second)
			err = subs.Acknowledge(actx, &pb.AcknowledgeRequest{Subscription: r.sub, AckIds: ids})
			cancel()
			if err == nil || endCtx.Err() != nil {
				break
			}
			_ = retry.Sleep(endCtx, ackBackoff.Delay(try+1))
		}
		if err != nil {
			// Pub/Sub will redeliver them; consume's inbox makes that harmless.
			r.l.Logger.Warn("local delivery: acknowledge failed; the messages will be redelivered", "subscription", r.r.Subscription,
				"messages", len(ids), "error", err.Error())
		}
		r.mu.Lock()
		for _, h := range batch {
			if r.held[h.id] == h {
				delete(r.held, h.id)
			}
		}
		r.mu.Unlock()
		r.signal(r.space)
		r.signal(r.kick)
	}
}

// keepLeases holds every held message under Lease until ctx ends: fresh
// ones at once (unless the server is in process), then each again when
// less than half its lease is left, checked every Lease/3. A message
// settled within a second costs one ModifyAckDeadline id, not one per
// tick (the emulator takes up to a millisecond per id on an ordered
// subscription).
func (r *runner) keepLeases(ctx context.Context) {
	t := time.NewTicker(r.l.Lease / 3)
	defer t.Stop()
	for {
		var hs []*held
		select {
		case <-ctx.Done():
			return
		case <-r.lease:
			r.mu.Lock()
			hs, r.fresh = r.fresh, nil
			r.mu.Unlock()
		case now := <-t.C:
			r.mu.Lock()
			for _, h := range r.held {
				if h.state != settling && h.leaseEnd.Sub(now) < r.l.Lease/2 {
					hs = append(hs, h)
				}
			}
			r.mu.Unlock()
		}
		if len(hs) == 0 {
			continue
		}
		ids := make([]string, 0, len(hs))
		r.mu.Lock()
		for _, h := range hs {
			if h.state != settling {
				ids = append(ids, h.ackID)
			}
		}
		r.mu.Unlock()
		t0 := time.Now()
		if r.modack(ctx, ids, r.l.Lease) == nil {
			r.mu.Lock()
			for _, h := range hs {
				h.leaseEnd = t0.Add(r.l.Lease)
			}
			r.mu.Unlock()
		}
	}
}

// modack sets the ack deadline of ids (0 hands them back), in chunks.
func (r *runner) modack(ctx context.Context, ids []string, d time.Duration) error {
	subs := r.l.Client.PubSub().SubscriptionAdminClient
	var firstErr error
	for len(ids) > 0 {
		n := min(len(ids), 1000)
		mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := subs.ModifyAckDeadline(mctx, &pb.ModifyAckDeadlineRequest{Subscription: r.sub, AckIds: ids[:n],
			AckDeadlineSeconds: int32((d + time.Second - 1) / time.Second)})
		cancel()
		if err != nil && firstErr == nil && ctx.Err() == nil {
			firstErr = err
			r.l.Logger.Warn("local delivery: modify ack deadline failed", "subscription", r.r.Subscription,
				"messages", n, "error", err.Error())
		}
		ids = ids[n:]
	}
	return firstErr
}

// handBack nacks every message still held, each key's in order, so Pub/Sub
// redelivers them at once (not after the lease).
func (r *runner) handBack(ctx context.Context) {
	r.mu.Lock()
	var rest []*held
	for _, h := range r.held {
		if h.state != settling {
			rest = append(rest, h)
		}
		if h.state == cutOff {
			r.cut++
		}
	}
	r.mu.Unlock()
	if len(rest) == 0 {
		return
	}
	sort.Slice(rest, func(i, j int) bool {
		a, b := rest[i], rest[j]
		if a.key != b.key {
			return a.key < b.key
		}
		if !a.msg.PublishTime.Equal(b.msg.PublishTime) {
			return a.msg.PublishTime.Before(b.msg.PublishTime)
		}
		return a.seq < b.seq
	})
	ids := make([]string, len(rest))
	for i, h := range rest {
		ids[i] = h.ackID
	}
	if r.modack(ctx, ids, 0) == nil && ctx.Err() == nil {
		r.handedBack = len(ids)
	} else {
		r.lapsing = len(ids)
	}
}

// acked reports whether a push endpoint's status acknowledges the message
// (Pub/Sub push: 102, 200, 201, 202, 204; anything else is redelivered).
func acked(code int) bool {
	switch code {
	case http.StatusProcessing, http.StatusOK, http.StatusCreated, http.StatusAccepted, http.StatusNoContent:
		return true
	}
	return false
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// post sends m to the route's URL in its mode's shape, bounded by the
// subscription's ack deadline, and returns the answer's status.
func (r *runner) post(ctx context.Context, m event.Message, attempt int) (int, error) {
	rt := r.r
	var (
		req *http.Request
		err error
	)
	switch rt.Mode {
	case topology.DeliveryEventarc:
		req, err = delivery.EventarcRequest(rt.URL, r.l.Project, rt.Topic, r.sub, m)
	case topology.DeliveryPush, "":
		req, err = http.NewRequest(http.MethodPost, rt.URL, bytes.NewReader(delivery.WrappedBody(m, r.sub, attempt)))
		if req != nil {
			req.Header.Set("Content-Type", "application/json")
		}
	default:
		err = fmt.Errorf("route %s: unknown delivery mode %q", rt.Subscription, rt.Mode)
	}
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, r.ackDeadline)
	defer cancel()
	resp, err := r.l.HTTP.Do(req.WithContext(ctx))
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}
