package devstack

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/relaybus/relaybus/shared/deadletter"
	"github.com/relaybus/relaybus/shared/delivery"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/names"
	"github.com/relaybus/relaybus/shared/topology"
	"github.com/relaybus/relaybus/shared/transport"
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
	// Mode is topology.DeliveryPush (wrapped push body with deliveryAttempt)
	// or topology.DeliveryEventarc (binary messagePublished CloudEvent).
	Mode string
	// MinBackoff and MaxBackoff space redeliveries of a refused message:
	// the n-th redelivery waits MinBackoff·2^(n-1), at most MaxBackoff. Zero
	// takes the subscription's own retry policy, multiplied by
	// Loop.BackoffScale (a subscription without one is redelivered after
	// NoPolicyBackoff, as Pub/Sub redelivers it "as soon as possible").
	MinBackoff, MaxBackoff time.Duration
	// MaxAttempts dead-letters a message to <Topic>.dlq after this many
	// refused deliveries (0 never does).
	MaxAttempts int
}

// NoPolicyBackoff is the pause before redelivering a message of a
// subscription that has no retry policy.
const NoPolicyBackoff = 100 * time.Millisecond

// Loop stands in for Eventarc and push subscriptions: it pulls each route's
// subscription and POSTs every message in its route's exact request shape
// (shared/delivery's builders), at most one in flight per ordering key, a
// refused message (any answer but 102, 200, 201, 202, 204, as push counts
// them, or no answer) redelivered after the subscription's backoff and,
// after the route's maximum attempts, published to <topic>.dlq with
// Pub/Sub's own dead-letter attributes (deadletter.PubSub) and
// acknowledged. pstest's dead-lettering does not work, and neither fake
// pushes, so the loop does both.
type Loop struct {
	// Client pulls the subscriptions and publishes dead letters.
	Client *transport.Client
	// Project is the project named in subscription paths and dead-letter
	// attributes.
	Project string
	// HTTP posts the deliveries (nil: keep-alive connections, 60 s timeout).
	HTTP *http.Client
	// BackoffScale multiplies backoffs taken from subscriptions' retry
	// policies (0 means 1: Pub/Sub's timing).
	BackoffScale float64
	// MaxInFlight bounds the deliveries in flight per route (256).
	MaxInFlight int
	// Logger receives one line per refused delivery and dead letter.
	Logger *slog.Logger

	wg sync.WaitGroup
}

// Run serves routes until ctx ends, then waits for in-flight deliveries
// (which finish; a message waiting out its backoff is nacked at once).
func (l *Loop) Run(ctx context.Context, routes []Route) {
	if l.HTTP == nil {
		l.HTTP = &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{
			MaxIdleConns: 1024, MaxIdleConnsPerHost: 1024, IdleConnTimeout: 90 * time.Second}}
	}
	if l.Logger == nil {
		l.Logger = slog.New(slog.DiscardHandler)
	}
	if l.BackoffScale <= 0 {
		l.BackoffScale = 1
	}
	if l.MaxInFlight <= 0 {
		l.MaxInFlight = 256
	}
	for _, r := range routes {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			l.serve(ctx, r)
		}()
	}
	<-ctx.Done()
	l.wg.Wait()
}

// policy fills in r's backoff from its subscription's retry policy.
func (l *Loop) policy(ctx context.Context, r Route) (Route, error) {
	if r.MinBackoff > 0 {
		if r.MaxBackoff < r.MinBackoff {
			r.MaxBackoff = r.MinBackoff
		}
		return r, nil
	}
	s, err := l.Client.PubSub().SubscriptionAdminClient.GetSubscription(ctx,
		&pb.GetSubscriptionRequest{Subscription: l.path(r.Subscription)})
	if err != nil {
		return r, fmt.Errorf("subscription %s: %w", r.Subscription, err)
	}
	rp := s.GetRetryPolicy()
	if rp == nil {
		r.MinBackoff, r.MaxBackoff = NoPolicyBackoff, NoPolicyBackoff
		return r, nil
	}
	// Pub/Sub's defaults for a retry policy that leaves a bound out.
	lo, hi := 10*time.Second, 600*time.Second
	if d := rp.GetMinimumBackoff(); d != nil {
		lo = d.AsDuration()
	}
	if d := rp.GetMaximumBackoff(); d != nil {
		hi = d.AsDuration()
	}
	r.MinBackoff = time.Duration(float64(lo) * l.BackoffScale)
	r.MaxBackoff = max(time.Duration(float64(hi)*l.BackoffScale), r.MinBackoff)
	return r, nil
}

func (l *Loop) path(sub string) string {
	return fmt.Sprintf("projects/%s/subscriptions/%s", l.Project, sub)
}

func (l *Loop) serve(ctx context.Context, r Route) {
	for {
		var err error
		if r, err = l.policy(ctx, r); err == nil {
			break
		}
		if ctx.Err() != nil {
			return
		}
		l.Logger.Warn("local delivery: cannot read the subscription; retrying", "subscription", r.Subscription, "error", err.Error())
		if sleep(ctx, time.Second) != nil {
			return
		}
	}
	sub := l.Client.PubSub().Subscriber(r.Subscription)
	sub.ReceiveSettings.NumGoroutines = 1
	sub.ReceiveSettings.MaxOutstandingMessages = l.MaxInFlight
	var (
		mu       sync.Mutex
		attempts = map[string]int{} // refused deliveries so far, by message id
	)
	keys := newKeyLocks()
	for ctx.Err() == nil {
		err := sub.Receive(ctx, func(_ context.Context, m *pubsub.Message) {
			// Ordered subscriptions already hand out one message per key at
			// a time; the lock makes it hold for any subscription.
			unlock := keys.lock(m.OrderingKey)
			defer unlock()
			if ctx.Err() != nil { // stopping: start nothing new
				m.Nack()
				return
			}
			mu.Lock()
			n := attempts[m.ID] + 1
			attempts[m.ID] = n
			mu.Unlock()
			settle := func(ack bool) {
				if ack {
					mu.Lock()
					delete(attempts, m.ID)
					mu.Unlock()
					m.Ack()
				} else {
					m.Nack()
				}
			}
			msg := event.Message{ID: m.ID, Data: m.Data, Attributes: m.Attributes, OrderingKey: m.OrderingKey,
				PublishTime: m.PublishTime, DeliveryAttempt: n, Topic: r.Topic}
			if r.MaxAttempts == 0 || n <= r.MaxAttempts {
				code, err := l.post(ctx, r, msg, n)
				if err == nil && acked(code) {
					settle(true)
					return
				}
				l.Logger.Debug("local delivery: refused", "subscription", r.Subscription, "message_id", m.ID,
					"ordering_key", m.OrderingKey, "delivery_attempt", n, "status", code, "error", errText(err))
			}
			if r.MaxAttempts > 0 && n >= r.MaxAttempts {
				dlq := names.DeadLetter(r.Topic)
				dl := deadletter.PubSub(msg, l.Project, l.path(r.Subscription), min(n, r.MaxAttempts))
				if _, err := l.Client.Publish(context.WithoutCancel(ctx), dlq, dl); err != nil {
					l.Logger.Error("local delivery: cannot dead-letter; will retry", "subscription", r.Subscription,
						"message_id", m.ID, "dead_letter_topic", dlq, "error", err.Error())
				} else {
					l.Logger.Warn("local delivery: dead-lettered after max delivery attempts", "subscription", r.Subscription,
						"message_id", m.ID, "ordering_key", m.OrderingKey, "attempts", r.MaxAttempts, "dead_letter_topic", dlq)
					settle(true)
					return
				}
			}
			// Hold the key for the backoff, as Pub/Sub's retry policy does,
			// then hand the message back for redelivery.
			_ = sleep(ctx, backoff(r.MinBackoff, r.MaxBackoff, n))
			settle(false)
		})
		if err != nil && ctx.Err() == nil {
			l.Logger.Warn("local delivery: receive stopped; retrying", "subscription", r.Subscription, "error", err.Error())
			_ = sleep(ctx, time.Second)
		}
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

// post sends m to r.URL in r.Mode's shape and returns the answer's status.
func (l *Loop) post(ctx context.Context, r Route, m event.Message, attempt int) (int, error) {
	var (
		req *http.Request
		err error
	)
	switch r.Mode {
	case topology.DeliveryEventarc:
		req, err = delivery.EventarcRequest(r.URL, l.Project, r.Topic, l.path(r.Subscription), m)
	case topology.DeliveryPush, "":
		req, err = http.NewRequest(http.MethodPost, r.URL, bytes.NewReader(delivery.WrappedBody(m, l.path(r.Subscription), attempt)))
		if req != nil {
			req.Header.Set("Content-Type", "application/json")
		}
	default:
		err = fmt.Errorf("route %s: unknown delivery mode %q", r.Subscription, r.Mode)
	}
	if err != nil {
		return 0, err
	}
	req = req.WithContext(context.WithoutCancel(ctx)) // finish in-flight work on shutdown
	resp, err := l.HTTP.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// backoff is the wait before the redelivery that follows refused delivery
// n (1-based): lo doubling per refusal, at most hi.
func backoff(lo, hi time.Duration, n int) time.Duration {
	d := lo
	for i := 1; i < n && d < hi; i++ {
		d *= 2
	}
	return min(d, hi)
}

// keyLocks serializes deliveries per ordering key ("" is not a key: those
// messages run concurrently).
type keyLocks struct {
	mu   sync.Mutex
	held map[string]*keyLock
}

type keyLock struct {
	ch      chan struct{}
	waiters int
}

func newKeyLocks() *keyLocks { return &keyLocks{held: map[string]*keyLock{}} }

func (k *keyLocks) lock(key string) (unlock func()) {
	if key == "" {
		return func() {}
	}
	k.mu.Lock()
	l, ok := k.held[key]
	if !ok {
		l = &keyLock{ch: make(chan struct{}, 1)}
		k.held[key] = l
	}
	l.waiters++
	k.mu.Unlock()
	l.ch <- struct{}{}
	return func() {
		<-l.ch
		k.mu.Lock()
		if l.waiters--; l.waiters == 0 {
			delete(k.held, key)
		}
		k.mu.Unlock()
	}
}
