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
	// Mode is topology.DeliveryPush (wrapped push body) or
	// topology.DeliveryEventarc (binary messagePublished CloudEvent).
	Mode string
	// MinBackoff and MaxBackoff space redeliveries of a refused message.
	MinBackoff, MaxBackoff time.Duration
	// MaxAttempts dead-letters a message to <topic>.dlq after this many
	// refused deliveries (0 never does).
	MaxAttempts int
}

// Loop stands in for Eventarc and push subscriptions: it pulls each route's
// subscription and POSTs every message in its route's exact request shape,
// one in flight per ordering key (the subscriptions have ordering on), a
// refused message redelivered after the subscription's backoff and, after
// its maximum attempts, published to <topic>.dlq with Pub/Sub's own
// dead-letter attributes and acknowledged (pstest's dead-lettering does not
// work, so the loop does it).
type Loop struct {
	Client  *transport.Client
	Project string
	HTTP    *http.Client
	Logger  *slog.Logger

	wg sync.WaitGroup
}

// Run serves routes until ctx ends, then waits for in-flight deliveries.
func (l *Loop) Run(ctx context.Context, routes []Route) {
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

func (l *Loop) serve(ctx context.Context, r Route) {
	sub := l.Client.PubSub().Subscriber(r.Subscription)
	sub.ReceiveSettings.NumGoroutines = 1
	sub.ReceiveSettings.MaxOutstandingMessages = 256
	var mu sync.Mutex
	attempts := map[string]int{}
	for ctx.Err() == nil {
		err := sub.Receive(ctx, func(mctx context.Context, m *pubsub.Message) {
			mu.Lock()
			attempts[m.ID]++
			n := attempts[m.ID]
			mu.Unlock()
			msg := event.Message{ID: m.ID, Data: m.Data, Attributes: m.Attributes, OrderingKey: m.OrderingKey,
				PublishTime: m.PublishTime, DeliveryAttempt: n, Topic: r.Topic}
			code, err := l.post(ctx, r, msg, n)
			if err == nil && code >= 200 && code < 300 {
				mu.Lock()
				delete(attempts, m.ID)
				mu.Unlock()
				m.Ack()
				return
			}
			if r.MaxAttempts > 0 && n >= r.MaxAttempts {
				dl := deadletter.PubSub(msg, l.Project, r.Subscription, n)
				if _, perr := l.Client.Publish(context.WithoutCancel(ctx), names.DeadLetter(r.Topic), dl); perr == nil {
					l.Logger.Warn("local delivery: dead-lettered after max attempts", "subscription", r.Subscription,
						"message_id", m.ID, "attempts", n, "dead_letter_topic", names.DeadLetter(r.Topic))
					mu.Lock()
					delete(attempts, m.ID)
					mu.Unlock()
					m.Ack()
					return
				}
			}
			// Hold the key for the backoff, as Pub/Sub's retry policy does.
			wait := backoff(r.MinBackoff, r.MaxBackoff, n)
			select {
			case <-time.After(wait):
			case <-ctx.Done():
			}
			m.Nack()
		})
		if err != nil && ctx.Err() == nil {
			l.Logger.Warn("local delivery: receive stopped; retrying", "subscription", r.Subscription, "error", err.Error())
			time.Sleep(time.Second)
		}
	}
}

func (l *Loop) post(ctx context.Context, r Route, m event.Message, attempt int) (int, error) {
	var (
		req *http.Request
		err error
	)
	full := fmt.Sprintf("projects/%s/subscriptions/%s", l.Project, r.Subscription)
	switch r.Mode {
	case topology.DeliveryEventarc:
		req, err = delivery.EventarcRequest(r.URL, l.Project, r.Topic, full, m)
	default:
		req, err = http.NewRequest(http.MethodPost, r.URL, bytes.NewReader(delivery.WrappedBody(m, full, attempt)))
		if req != nil {
			req.Header.Set("Content-Type", "application/json")
		}
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

func backoff(lo, hi time.Duration, n int) time.Duration {
	d := lo
	for i := 1; i < n && d < hi; i++ {
		d *= 2
	}
	return min(d, hi)
}
