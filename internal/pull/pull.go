// Package pull is relaybus's pull consumer mode: a long-running worker that
// pulls one subscription through a broker's [Source] and hands every message
// to the consume engine, the same engine push and Eventarc deliveries reach
// over HTTP. It is for consumers that HTTP push cannot reach (another cloud,
// on premises, a worker pool).
//
// The worker keeps one message in flight per ordering key, in the order it
// pulled them, and at most MaxInFlight deliveries at once. A message the
// engine refuses (a transient failure) stays with the worker, under its
// lease, and is retried after a backoff with every later message of its key
// queued behind it, so a redelivery never overtakes the key's next message;
// a delivery the engine held back without an attempt (Answer.Held: a
// forward consumer's circuit breaker is open) waits as long as the engine
// asks, under its lease, and counts nothing; at the last attempt a
// refused message is published to <topic>.dlq with Pub/Sub's own
// dead-letter attributes (deadletter.PubSub) and acknowledged, whatever the
// broker (pstest and JetStream have no dead-letter topic of their own). A
// message is acknowledged only after the engine has answered, that is after
// its Postgres transaction committed.
//
// Order holds within one worker. Run one worker per subscription for
// strict per-key order, or several with a strict consumer (the inbox's
// version gate parks what arrives early): two workers pulling the same
// JetStream consumer may each hold a message of one key.
package pull

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/relaybus/relaybus/internal/deadletter"
	"github.com/relaybus/relaybus/internal/delivery"
	"github.com/relaybus/relaybus/internal/logging"
	"github.com/relaybus/relaybus/internal/names"
	"github.com/relaybus/relaybus/internal/retry"
	"github.com/relaybus/relaybus/shared/broker"
	"github.com/relaybus/relaybus/shared/event"
)

// Source is what the worker needs of a broker: pulling a subscription's
// messages under a lease. It is the broker contract's Puller
// (shared/broker), which every driver implements.
type Source = broker.Puller

// Leased is one pulled message and its lease (broker.Lease).
type Leased = broker.Lease

// Engine handles one delivery: the consume engine (consume adapts a
// *consumer.Engine's Result; this package does not import the engine, so
// the transports that implement Source stay below it).
type Engine interface {
	Handle(ctx context.Context, d delivery.Delivery) Answer
}

// Answer is what the engine did with a delivery, as the worker needs it.
type Answer struct {
	// Status is the HTTP status push would have answered: 102, 200, 201,
	// 202 and 204 acknowledge, anything else refuses.
	Status int
	// Attempt is the consumer's attempt number (the inbox's count).
	Attempt int
	// EventID, Code and Error describe a refusal in the logs.
	EventID, Code, Error string
	// Held: the engine held the delivery back without an attempt (a
	// forward consumer's circuit breaker is open). The worker keeps the
	// message under its lease and delivers it again after RetryAfter,
	// without counting an attempt: a held message never reaches
	// MaxAttempts, however long it is held.
	Held       bool
	RetryAfter time.Duration
}

// minHeld is the least a held message waits before it is delivered again.
const minHeld = 10 * time.Millisecond

// Defaults of Options.
const (
	DefaultMaxInFlight    = 16
	DefaultMaxOutstanding = 256
	DefaultMaxAttempts    = 5 // consumer.DefaultMaxDeliveryAttempts
	DefaultMinBackoff     = time.Second
	DefaultMaxBackoff     = time.Minute
	DefaultExtendEvery    = 10 * time.Second
	maxPull               = 100
)

// Options configure a Worker. Source, Subscription, Engine and DeadLetters
// are required.
type Options struct {
	Source Source
	// Subscription is the subscription (Pub/Sub) or durable consumer
	// (JetStream) pulled, by its topology id.
	Subscription string
	// Engine handles the messages.
	Engine Engine
	// DeadLetters receives messages refused MaxAttempts times, on
	// <topic>.dlq.
	DeadLetters event.Publisher
	// Project names the source subscription's project in the dead-letter
	// attributes.
	Project string
	// MaxInFlight bounds the deliveries running at once
	// (DefaultMaxInFlight).
	MaxInFlight int
	// MaxOutstanding bounds the messages held: pulled and neither
	// acknowledged nor handed back (DefaultMaxOutstanding).
	MaxOutstanding int
	// MaxAttempts dead-letters a message refused that many times
	// (DefaultMaxAttempts; the subscription's max_delivery_attempts).
	MaxAttempts int
	// MinBackoff and MaxBackoff space the retries of a refused message,
	// and of a pull that failed: the n-th waits MinBackoff·2^(n-1), at
	// most MaxBackoff, lengthened by up to 20% jitter and never past
	// MaxBackoff (retry.Policy with NoShorter: the minimum holds, as in
	// Pub/Sub's retry policy; defaults 1s, 1m: the subscription's).
	MinBackoff, MaxBackoff time.Duration
	// ExtendEvery is how often held messages' leases are renewed
	// (DefaultExtendEvery; a third of the ack deadline is right).
	ExtendEvery time.Duration
	// Logger receives a line per refused delivery and dead letter.
	Logger *slog.Logger
	// Paused, when set, is asked before every pull: while it answers
	// true the worker pulls nothing and asks again after the duration it
	// returns (at least 10ms). What it holds already is delivered as
	// usual, so the engine answers those with a hold (Answer.Held) while
	// the pause lasts: the operators' pause of a pull consumer
	// (consume.PullPaused).
	Paused func(ctx context.Context) (bool, time.Duration)
}

// Worker pulls one subscription into the engine. Run it once.
type Worker struct {
	o Options

	slots    chan struct{} // one per message held
	inFlight chan struct{} // one per delivery running
	// pulled is closed when the worker has stopped pulling: hand-backs
	// wait for it, so a pull still open on the broker cannot take a
	// handed-back message ahead of its key's next one.
	pulled chan struct{}

	mu    sync.Mutex
	lanes map[string][]*item // queued messages of each ordering key with a running lane
	held  map[*item]struct{}
	byID  map[string]*item // the held items by message id
	wg    sync.WaitGroup
}

type item struct {
	m        event.Message // DeliveryAttempt under mu
	attempts int           // deliveries made by this worker

	// mu orders the lease's renewals against its settling: once settled
	// (acknowledged or handed back) the lease is never renewed again. A
	// renewal that reached the broker after a hand-back would hold the
	// message again (Pub/Sub's ModifyAckDeadline after a nack; JetStream's
	// in-progress after a Nak), so it came back a lease later, behind the
	// next versions of its key. It also orders them against a
	// redelivery's new lease taking the place of a lapsed one (dispatch).
	mu      sync.Mutex
	l       Leased
	settled bool
}

// New returns a worker over o.
func New(o Options) (*Worker, error) {
	switch {
	case o.Source == nil:
		return nil, errors.New("pull: Options.Source is required")
	case o.Subscription == "":
		return nil, errors.New("pull: Options.Subscription is required")
	case o.Engine == nil:
		return nil, errors.New("pull: Options.Engine is required")
	case o.DeadLetters == nil:
		return nil, errors.New("pull: Options.DeadLetters is required")
	}
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	defD := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&o.MaxInFlight, DefaultMaxInFlight)
	def(&o.MaxOutstanding, DefaultMaxOutstanding)
	def(&o.MaxAttempts, DefaultMaxAttempts)
	defD(&o.MinBackoff, DefaultMinBackoff)
	defD(&o.MaxBackoff, DefaultMaxBackoff)
	defD(&o.ExtendEvery, DefaultExtendEvery)
	if o.Logger == nil {
		o.Logger = logging.Discard()
	}
	return &Worker{o: o, slots: make(chan struct{}, o.MaxOutstanding), inFlight: make(chan struct{}, o.MaxInFlight),
		lanes: map[string][]*item{}, held: map[*item]struct{}{}, byID: map[string]*item{}, pulled: make(chan struct{})}, nil
}

// Run pulls and delivers until ctx ends, then drains: it pulls no more,
// lets the deliveries in flight finish (acknowledged or handed back as
// usual), hands back what was queued or waiting out a backoff, and
// returns. It returns nil after a graceful drain, or the error that
// stopped pulling.
func (w *Worker) Run(ctx context.Context) error {
	stopExtend := make(chan struct{})
	extended := make(chan struct{})
	go func() { defer close(extended); w.extend(stopExtend) }()
	err := w.pullLoop(ctx)
	close(w.pulled)
	w.wg.Wait()
	close(stopExtend)
	<-extended
	if err != nil && ctx.Err() == nil {
		return err
	}
	return nil // drained: ctx ended, whatever the last pull answered
}

func (w *Worker) pullLoop(ctx context.Context) error {
	failures := 0
	for {
		// Wait for room, then take what more is free, up to maxPull.
		select {
		case <-ctx.Done():
			return ctx.Err()
		case w.slots <- struct{}{}:
		}
		n := 1
	fill:
		for n < maxPull {
			select {
			case w.slots <- struct{}{}:
				n++
			default:
				break fill
			}
		}
		if w.o.Paused != nil {
			if paused, again := w.o.Paused(ctx); paused {
				for range n {
					<-w.slots
				}
				if !wait(ctx, max(again, minHeld)) {
					return ctx.Err()
				}
				continue
			}
		}
		got, err := w.o.Source.Pull(ctx, w.o.Subscription, n)
		for range n - len(got) {
			<-w.slots
		}
		// What a failed pull returned is leased to us all the same: it is
		// delivered (or handed back), never left to lapse behind its key.
		for _, l := range got {
			w.dispatch(ctx, &item{m: l.Message(), l: l})
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			failures++
			w.o.Logger.WarnContext(ctx, "pull: pull failed", "subscription", w.o.Subscription, "error", err.Error())
			if !wait(ctx, w.backoff().Delay(failures)) {
				return ctx.Err()
			}
			continue
		}
		failures = 0
	}
}

// dispatch queues it behind its key's lane, or starts a lane for it.
// Messages without an ordering key each get a lane of their own.
//
// A message the worker holds already, not settled yet, is a redelivery
// after its lease lapsed (a renewal came late): the broker knows only the
// new lease, so it takes the place of the lapsed one, where the message
// is in its key's queue, and frees its slot. Queued as a message of its
// own it came after its key's later messages, delivered again after them
// and handed back after them.
func (w *Worker) dispatch(ctx context.Context, it *item) {
	key := it.m.OrderingKey
	w.mu.Lock()
	if old, ok := w.byID[it.m.ID]; ok && it.m.ID != "" {
		old.mu.Lock()
		if !old.settled {
			old.l, old.m.DeliveryAttempt = it.l, it.m.DeliveryAttempt
			old.mu.Unlock()
			w.mu.Unlock()
			<-w.slots
			return
		}
		old.mu.Unlock()
	}
	w.held[it] = struct{}{}
	if it.m.ID != "" {
		w.byID[it.m.ID] = it
	}
	if key != "" {
		if q, ok := w.lanes[key]; ok {
			w.lanes[key] = append(q, it)
			w.mu.Unlock()
			return
		}
		w.lanes[key] = nil
	}
	w.mu.Unlock()
	w.wg.Add(1)
	go w.lane(ctx, key, it)
}

// lane delivers it, then the key's queued messages, one at a time.
func (w *Worker) lane(ctx context.Context, key string, it *item) {
	defer w.wg.Done()
	for it != nil {
		if !w.deliver(ctx, it) {
			// Shutting down: hand back it and everything queued behind it.
			w.handBack(it)
			w.mu.Lock()
			q := w.lanes[key]
			delete(w.lanes, key)
			w.mu.Unlock()
			for _, q := range q {
				w.handBack(q)
			}
			return
		}
		if key == "" {
			return
		}
		w.mu.Lock()
		q := w.lanes[key]
		if len(q) == 0 {
			delete(w.lanes, key)
			it = nil
		} else {
			it, w.lanes[key] = q[0], q[1:]
		}
		w.mu.Unlock()
	}
}

// deliver runs it through the engine until it is acknowledged (true) or
// the worker stops before it is (false: the caller hands it back).
func (w *Worker) deliver(ctx context.Context, it *item) bool {
	for {
		if ctx.Err() != nil {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case w.inFlight <- struct{}{}:
		}
		it.attempts++
		it.mu.Lock()
		m := it.m
		it.mu.Unlock()
		if m.DeliveryAttempt > 0 {
			m.DeliveryAttempt += it.attempts - 1 // the broker's count, plus our retries
		}
		// The delivery itself is not cut by shutdown: its transaction
		// commits or rolls back, and its answer is acted on.
		dctx := context.WithoutCancel(ctx)
		res := w.o.Engine.Handle(dctx, delivery.Delivery{Message: m, Subscription: w.o.Subscription})
		<-w.inFlight
		if accepted(res.Status) {
			w.settle(dctx, it, func() error { return it.l.Ack(dctx) }, "ack")
			return true
		}
		if res.Held {
			// Not an attempt: the message stays leased here, its key's
			// later messages behind it, and nothing is counted.
			it.attempts--
			if !wait(ctx, max(res.RetryAfter, minHeld)) {
				return false
			}
			continue
		}
		n := max(m.DeliveryAttempt, res.Attempt, it.attempts)
		log := w.o.Logger.With("subscription", w.o.Subscription, "message_id", m.ID, "ordering_key", m.OrderingKey,
			"event_id", res.EventID, "attempt", n, "status", res.Status, "code", res.Code)
		if n >= w.o.MaxAttempts {
			dlq := names.DeadLetter(m.Topic)
			if _, err := w.o.DeadLetters.Publish(dctx, dlq, deadletter.PubSub(m, w.o.Project, w.o.Subscription, n)); err != nil {
				log.ErrorContext(ctx, "pull: cannot dead-letter; retrying", "dead_letter_topic", dlq, "error", err.Error())
			} else {
				log.WarnContext(ctx, "pull: dead-lettered after max attempts", "dead_letter_topic", dlq)
				w.settle(dctx, it, func() error { return it.l.Ack(dctx) }, "ack")
				return true
			}
		} else {
			log.InfoContext(ctx, "pull: delivery refused; retrying after backoff", "error", res.Error)
		}
		if !wait(ctx, w.backoff().Delay(it.attempts)) {
			return false
		}
	}
}

// handBack returns it to the broker for redelivery as soon as it will.
func (w *Worker) handBack(it *item) {
	<-w.pulled
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w.settle(ctx, it, func() error { return it.l.Nack(ctx, 0) }, "nack")
}

// settle acknowledges or hands back it and frees its slot. A failed ack
// is logged: the lease lapses and the broker redelivers, which the inbox
// absorbs.
func (w *Worker) settle(ctx context.Context, it *item, f func() error, what string) {
	it.mu.Lock()
	it.settled = true
	err := f()
	it.mu.Unlock()
	if err != nil {
		w.o.Logger.WarnContext(ctx, "pull: "+what+" failed; the message will be redelivered", "subscription", w.o.Subscription,
			"message_id", it.m.ID, "error", err.Error())
	}
	w.mu.Lock()
	delete(w.held, it)
	if w.byID[it.m.ID] == it {
		delete(w.byID, it.m.ID)
	}
	w.mu.Unlock()
	<-w.slots
}

// extend renews every held message's lease every ExtendEvery until stop.
func (w *Worker) extend(stop <-chan struct{}) {
	t := time.NewTicker(w.o.ExtendEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		w.mu.Lock()
		its := make([]*item, 0, len(w.held))
		for it := range w.held {
			its = append(its, it)
		}
		w.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), w.o.ExtendEvery)
		for _, it := range its {
			it.mu.Lock()
			var err error
			if !it.settled {
				err = it.l.Extend(ctx)
			}
			it.mu.Unlock()
			if err != nil {
				w.o.Logger.WarnContext(ctx, "pull: lease extension failed", "message_id", it.m.ID, "error", err.Error())
			}
		}
		cancel()
	}
}

// accepted is how push counts an answer as an acknowledgement.
func accepted(status int) bool {
	switch status {
	case http.StatusOK, http.StatusCreated, http.StatusAccepted, http.StatusNoContent, http.StatusProcessing:
		return true
	}
	return false
}

// backoff is the policy of the worker's retries (Options.MinBackoff,
// MaxBackoff).
func (w *Worker) backoff() retry.Policy {
	return retry.Policy{Initial: w.o.MinBackoff, Max: w.o.MaxBackoff, NoShorter: true}
}

// wait waits d or until ctx ends, and reports whether d passed.
func wait(ctx context.Context, d time.Duration) bool { return retry.Sleep(ctx, d) == nil }
