// Package bridge feeds pull subscriptions to HTTP handlers the way a Pub/Sub
// push subscription would: each message in push's wrapped JSON body, one
// message in flight per ordering key, a refused message redelivered after
// the route's backoff with its key's later messages behind it, and the
// acknowledgement only after a 2xx answer. internal/pull's worker does all
// of that; a route's handler is its engine.
//
// On a broker without push (NATS JetStream) it is how the functions that
// take pushes are fed: the rollup's notices and each topic's dead letters
// (the DLQ monitors). The deployed rollup and operations API run it over
// their own handlers, in process; the local stack runs it over the
// functions' URLs ([Remote]).
package bridge

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/relaybus/relaybus/internal/delivery"
	"github.com/relaybus/relaybus/internal/logging"
	"github.com/relaybus/relaybus/internal/pull"
	"github.com/relaybus/relaybus/shared/broker"
)

// Defaults of Options and Route.
const (
	// DefaultMaxInFlight bounds a route's deliveries at once.
	DefaultMaxInFlight = 64
	// DefaultMaxOutstanding bounds a route's pulled messages not yet
	// acknowledged (at least its MaxInFlight).
	DefaultMaxOutstanding = 1000
	// DefaultTimeout bounds one delivery's request.
	DefaultTimeout = time.Minute
	// DefaultGrace is how long the deliveries in flight at shutdown may
	// finish before their requests are cut (below Cloud Run's 10 s between
	// SIGTERM and SIGKILL).
	DefaultGrace = 8 * time.Second
)

// Route is one subscription and the handler its messages go to.
type Route struct {
	// Subscription is the subscription (a JetStream durable consumer) to
	// pull. Required.
	Subscription string
	// Handler answers each message as it would answer a push: a 2xx
	// acknowledges, anything else refuses. Required.
	Handler http.Handler
	// MaxInFlight bounds the route's deliveries at once
	// (DefaultMaxInFlight).
	MaxInFlight int
	// MinBackoff and MaxBackoff space the redeliveries of a refused
	// message (internal/pull's defaults when zero).
	MinBackoff, MaxBackoff time.Duration
	// Timeout bounds one request (DefaultTimeout).
	Timeout time.Duration
}

// Options configure Run.
type Options struct {
	// Source pulls the routes' subscriptions. Required. (Its Publisher
	// is the workers' dead-letter publisher, which routes never reach.)
	Source broker.Broker
	// Project names the subscriptions in the push bodies
	// (projects/<project>/subscriptions/<id>). Required.
	Project string
	// Routes are fed one worker each.
	Routes []Route
	// Grace is how long what is in flight at shutdown may finish
	// (DefaultGrace).
	Grace time.Duration
	// Logger defaults to logging.Discard.
	Logger *slog.Logger
}

// Run feeds every route until ctx ends, then drains: what is in flight
// finishes within Grace and is acknowledged, the rest is handed back.
// Routes never dead-letter: the rollup and DLQ monitor subscriptions have
// no dead-letter topic, so a refused message is retried after the route's
// backoff for as long as it takes. A route that cannot start is an error
// before anything runs.
func Run(ctx context.Context, o Options) error {
	if o.Source == nil || o.Project == "" {
		return errors.New("bridge: Source and Project are required")
	}
	if o.Grace <= 0 {
		o.Grace = DefaultGrace
	}
	if o.Logger == nil {
		o.Logger = logging.Discard()
	}
	// cut ends the requests still in flight Grace after shutdown began:
	// the worker hands their messages back.
	cut, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stop := context.AfterFunc(ctx, func() {
		t := time.NewTimer(o.Grace)
		defer t.Stop()
		select {
		case <-t.C:
			cancel()
		case <-cut.Done():
		}
	})
	defer stop()
	workers := make([]*pull.Worker, 0, len(o.Routes))
	for _, rt := range o.Routes {
		if rt.Subscription == "" || rt.Handler == nil {
			return errors.New("bridge: a route needs a Subscription and a Handler")
		}
		inFlight := rt.MaxInFlight
		if inFlight <= 0 {
			inFlight = DefaultMaxInFlight
		}
		timeout := rt.Timeout
		if timeout <= 0 {
			timeout = DefaultTimeout
		}
		w, err := pull.New(pull.Options{Source: o.Source, Subscription: rt.Subscription, DeadLetters: o.Source, Project: o.Project,
			Engine:      engine{h: rt.Handler, sub: "projects/" + o.Project + "/subscriptions/" + rt.Subscription, timeout: timeout, cut: cut},
			MaxInFlight: inFlight, MaxOutstanding: max(DefaultMaxOutstanding, inFlight), MaxAttempts: 1 << 30,
			MinBackoff: rt.MinBackoff, MaxBackoff: rt.MaxBackoff, Logger: o.Logger})
		if err != nil {
			return fmt.Errorf("bridge: %s: %w", rt.Subscription, err)
		}
		workers = append(workers, w)
	}
	var wg sync.WaitGroup
	errs := make([]error, len(workers))
	for i, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := w.Run(ctx); err != nil {
				errs[i] = fmt.Errorf("bridge: %s: %w", o.Routes[i].Subscription, err)
				o.Logger.Error("bridge: worker stopped", "subscription", o.Routes[i].Subscription, "error", err.Error())
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// engine serves one delivery to the route's handler in push's wrapped
// shape and answers with its status.
type engine struct {
	h       http.Handler
	sub     string
	timeout time.Duration
	cut     context.Context
}

func (e engine) Handle(ctx context.Context, d delivery.Delivery) pull.Answer {
	ctx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	defer context.AfterFunc(e.cut, cancel)()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "/", bytes.NewReader(delivery.WrappedBody(d.Message, e.sub, d.Message.DeliveryAttempt)))
	if err != nil {
		return pull.Answer{Error: err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	w := &answer{header: http.Header{}}
	e.h.ServeHTTP(w, req)
	if w.status == 0 {
		w.status = http.StatusOK // net/http's answer to a handler that wrote nothing
	}
	return pull.Answer{Status: w.status}
}

// answer is the ResponseWriter of an in-process delivery: it keeps the
// status and drops the body.
type answer struct {
	header http.Header
	status int
}

func (a *answer) Header() http.Header { return a.header }

func (a *answer) Write(p []byte) (int, error) {
	if a.status == 0 {
		a.status = http.StatusOK
	}
	return len(p), nil
}

func (a *answer) WriteHeader(status int) {
	if a.status == 0 {
		a.status = status
	}
}

// Remote is a handler that POSTs each delivery to url with client and
// answers with the endpoint's status (502 when no answer came: refused,
// as push counts it). The local stack feeds the functions it serves over
// HTTP with it.
func Remote(client *http.Client, url string) http.Handler {
	return remote{client: client, url: url}
}

type remote struct {
	client *http.Client
	url    string
}

func (r remote) ServeHTTP(w http.ResponseWriter, in *http.Request) {
	req, err := http.NewRequestWithContext(in.Context(), http.MethodPost, r.url, in.Body)
	if err != nil {
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.client.Do(req)
	if err != nil {
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	w.WriteHeader(resp.StatusCode)
}
