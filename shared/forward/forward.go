// Package forward is the consumer handler that hands each event to a
// service in any language: it POSTs the event as a binary-mode CloudEvent
// (ce-* headers, the payload as body) to a URL and maps the answer to the
// consume error taxonomy: 2xx success; 408 and 429 transient; other 4xx
// permanent (the service refuses the event for good); 5xx, timeouts and
// network errors transient.
package forward

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"

	"github.com/relaybus/relaybus/shared/consumer"
)

// DefaultTimeout bounds one forward.
const DefaultTimeout = 10 * time.Second

// Options configure a forwarder. URL is required.
type Options struct {
	// URL receives the events.
	URL string
	// Client sends the requests (a client with Timeout when nil).
	Client *http.Client
	// Timeout bounds one request (DefaultTimeout).
	Timeout time.Duration
	// Header is added to every request (an Authorization header, say).
	Header http.Header
}

// New returns a handler that forwards every event to o.URL.
func New(o Options) (consumer.Handler, error) {
	if o.URL == "" {
		return nil, errors.New("forward: Options.URL is required (FORWARD_URL)")
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Client == nil {
		o.Client = &http.Client{Timeout: o.Timeout}
	}
	return consumer.HandlerFunc(func(ctx context.Context, c *consumer.Context) error {
		ctx, cancel := context.WithTimeout(ctx, o.Timeout)
		defer cancel()
		ce := c.Event.CloudEvent()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, o.URL, nil)
		if err != nil {
			return consumer.Permanent("forward_url", err)
		}
		if err := cehttp.WriteRequest(ctx, binding.ToMessage(&ce), req); err != nil {
			return consumer.Permanent("forward_encode", fmt.Errorf("forward: encode: %w", err))
		}
		for k, vs := range o.Header {
			for _, v := range vs {
				req.Header.Add(k, v)
			}
		}
		req.Header.Set("X-Relaybus-Consumer", c.ConsumerID)
		req.Header.Set("X-Relaybus-Attempt", fmt.Sprint(c.Attempt))
		resp, err := o.Client.Do(req)
		if err != nil {
			return consumer.Transient("forward_unreachable", fmt.Errorf("forward to %s: %w", o.URL, err))
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		resp.Body.Close()
		return classify(resp.StatusCode, string(body))
	}), nil
}

// classify maps the target's status to the taxonomy.
func classify(status int, body string) error {
	err := fmt.Errorf("forward: the target answered %d: %s", status, body)
	switch {
	case status >= 200 && status < 300:
		return nil
	case status == http.StatusRequestTimeout || status == http.StatusTooManyRequests:
		return consumer.Transient(fmt.Sprintf("forward_%d", status), err)
	case status >= 400 && status < 500:
		return consumer.Permanent(fmt.Sprintf("forward_%d", status), err)
	}
	return consumer.Transient(fmt.Sprintf("forward_%d", status), err)
}
