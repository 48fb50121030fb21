// Package client is a Go client for relaybus's publish API (the publish
// function, functions/publish): it sends one event or a batch, as a
// CloudEvent (binary, structured or batch mode) or as the plain JSON
// envelope, and retries what may be retried with the same event ids, so
// a retry after a lost answer never writes an event twice (publish is
// idempotent on eventId: a repeat answers the recorded event with
// Duplicate set and writes nothing).
//
// Go services that own a Postgres transaction should enqueue in it
// instead (outbox.Enqueue), so the event is written if and only if their
// own rows are; this client is for Go programs that have no outbox of
// their own.
//
//	c, err := client.New("https://relaybus-publish-xyz.a.run.app", client.Options{
//		HTTPClient: idTokenClient, // behind Cloud Run IAM: google.golang.org/api/idtoken.NewClient
//		Source:     "order-service",
//	})
//	res, err := c.Publish(ctx, &event.Event{Type: "order.purchased", Topic: "shop.order.events",
//		AggregateID: "o-1", Version: 1, Payload: []byte(`{"amount":42}`)})
//	var fe *client.InvalidError
//	if errors.As(err, &fe) { ... fe.Fields name each field and its rule ... }
//
// # Retries
//
// A request is retried when no answer arrived (the connection failed or
// was lost: the events may have been written, which the same ids make
// harmless), and on 429, 500, 502, 503 and 504. A 503 or 429 with
// Retry-After waits what it says (seconds or an HTTP date) when that is
// longer than the backoff; a wait that would outlast ctx's deadline is
// not started, and the last answer is returned. Every other answer is
// final. Before the first attempt an event without an id is given one
// (event.NewID), so every attempt carries the same ids.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/relaybus/relaybus/internal/retry"
	"github.com/relaybus/relaybus/shared/event"
)

// Mode is how events are written on the wire.
type Mode string

// Modes. A batch in ModeBinary or ModeStructured is sent in CloudEvents
// batch mode (application/cloudevents-batch+json), which has no binary
// form.
const (
	// ModeBinary is CloudEvents binary mode: ce-* headers, the body is the
	// payload and Content-Type its type (the CloudEvents SDK's default
	// mode; the client writes it over net/http, without the SDK).
	ModeBinary Mode = "binary"
	// ModeStructured is CloudEvents structured mode:
	// application/cloudevents+json.
	ModeStructured Mode = "structured"
	// ModeEnvelope is relaybus's plain JSON envelope (application/json):
	// relaybus's field names (eventId, eventType, aggregateId, ...).
	ModeEnvelope Mode = "envelope"
)

// Defaults of Options.
const (
	DefaultMode           = ModeBinary
	DefaultMaxAttempts    = 5
	DefaultInitialBackoff = 200 * time.Millisecond
	DefaultMaxBackoff     = 10 * time.Second
	DefaultTimeout        = 30 * time.Second
)

// Options configure a Client. Every field is optional.
type Options struct {
	// HTTPClient sends the requests (an http.Client with DefaultTimeout
	// when nil). Behind Cloud Run IAM pass one that adds an ID token for
	// the publish service's URL (google.golang.org/api/idtoken.NewClient).
	HTTPClient *http.Client
	// Mode is how events are written (DefaultMode, CloudEvents binary).
	Mode Mode
	// Source is the producing service, set on events that name none
	// (CloudEvents requires a source).
	Source string
	// SourceVersion is the producing service's own version (its release,
	// build or revision), set on events that name none; empty sets none.
	SourceVersion string
	// MaxAttempts bounds the attempts of one call, the first included
	// (DefaultMaxAttempts); 1 disables retries.
	MaxAttempts int
	// InitialBackoff is the wait before the first retry; it doubles per
	// retry up to MaxBackoff, spread by ±20% jitter and never past
	// MaxBackoff (DefaultInitialBackoff, DefaultMaxBackoff). A Retry-After
	// longer than the backoff is waited instead.
	InitialBackoff, MaxBackoff time.Duration
}

// Client publishes events to one publish endpoint. It is safe for
// concurrent use.
type Client struct {
	endpoint string
	o        Options
}

// New returns a client for the publish function at endpoint (its URL; the
// function serves every path).
func New(endpoint string, o Options) (*Client, error) {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("client: endpoint %q: must be an http or https URL", endpoint)
	}
	switch o.Mode {
	case "":
		o.Mode = DefaultMode
	case ModeBinary, ModeStructured, ModeEnvelope:
	default:
		return nil, fmt.Errorf("client: Options.Mode %q: must be %s, %s or %s", o.Mode, ModeBinary, ModeStructured, ModeEnvelope)
	}
	if o.HTTPClient == nil {
		o.HTTPClient = &http.Client{Timeout: DefaultTimeout}
	}
	if o.MaxAttempts <= 0 {
		o.MaxAttempts = DefaultMaxAttempts
	}
	if o.InitialBackoff <= 0 {
		o.InitialBackoff = DefaultInitialBackoff
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = DefaultMaxBackoff
	}
	return &Client{endpoint: endpoint, o: o}, nil
}

// Statuses of a Result.
const (
	// StatusPublished: Pub/Sub has the event (publish's fast path).
	StatusPublished = "published"
	// StatusPending: the event is in the outbox; the relay publishes it.
	StatusPending = "pending"
	// StatusFailed: a duplicate whose first copy exhausted its publish
	// attempts and waits for an operator.
	StatusFailed = "failed"
	// StatusSkipped: the topic has no enabled consumer; nothing was
	// written (see SkippedError).
	StatusSkipped = "SKIPPED"
)

// Result is publish's answer for one event.
type Result struct {
	EventID string `json:"eventId"`
	// Status is StatusPublished, StatusPending, StatusFailed or
	// StatusSkipped.
	Status string `json:"status"`
	// Duplicate: publish already held this event (an earlier attempt or
	// call wrote it under this eventId, with the same topic, aggregate,
	// version, type and payload); nothing was written, and the fields
	// describe the recorded event. Another event under the same id is a
	// ConflictError.
	Duplicate   bool   `json:"duplicate"`
	Topic       string `json:"topic"`
	AggregateID string `json:"aggregateId"`
	Version     int64  `json:"version"`
	TraceID     string `json:"traceId"`
	// Reason says why an event was skipped.
	Reason string `json:"reason,omitempty"`
	// LastError is the last publish error of an event not yet published.
	LastError string `json:"lastError,omitempty"`
	// DeliverAt is when a scheduled event (event.Event.DeliverAt) is due;
	// zero for an event that is not scheduled. A scheduled event is
	// StatusPending until the relay publishes it then.
	DeliverAt time.Time `json:"deliverAt,omitzero"`
}

// Publish publishes one event and returns publish's result. An event
// whose topic has no enabled consumer is not written: the result says
// StatusSkipped and the error is a *SkippedError. The event's ID is set
// when it had none.
func (c *Client) Publish(ctx context.Context, e *event.Event) (Result, error) {
	rs, err := c.send(ctx, []*event.Event{e}, false)
	if len(rs) == 1 {
		return rs[0], err
	}
	return Result{}, err
}

// PublishBatch publishes events in one request: all are validated first
// and, if any is invalid, none is written (the *InvalidError's fields
// carry each event's index); the rest are written in one transaction. It
// returns one result per event, in order; when some were skipped, the
// results come with a *SkippedError naming them. Events without an ID are
// given one.
func (c *Client) PublishBatch(ctx context.Context, events []*event.Event) ([]Result, error) {
	if len(events) == 0 {
		return nil, nil
	}
	return c.send(ctx, events, true)
}

// send encodes the events once and posts them until a final answer.
func (c *Client) send(ctx context.Context, events []*event.Event, batch bool) ([]Result, error) {
	for i, e := range events {
		if e == nil {
			return nil, fmt.Errorf("client: event %d is nil", i)
		}
		if e.ID == "" {
			e.ID = event.NewID()
		}
		if e.Source == "" && e.Initiator.Service == "" {
			e.Source = c.o.Source
		}
		if e.SourceVersion == "" {
			e.SourceVersion = c.o.SourceVersion
		}
		// The defaults publish would fill (payload type, schema version,
		// aggregate type), so every mode writes the same event.
		e.Normalize()
	}
	header, body, err := c.encode(events, batch)
	if err != nil {
		return nil, err
	}
	var last error
	for attempt := 1; ; attempt++ {
		status, respHeader, respBody, err := c.post(ctx, header, body)
		if err == nil {
			rs, err := decodeAnswer(status, respBody, batch, len(events))
			if err == nil {
				return rs, skipped(rs)
			}
			var ae *APIError
			if !errors.As(err, &ae) || !retryable(status) {
				return nil, err
			}
			ae.Attempts = attempt
			last = err
		} else {
			if ctx.Err() != nil {
				return nil, errors.Join(ctx.Err(), err)
			}
			last = &NetworkError{Attempts: attempt, Err: err}
		}
		if attempt >= c.o.MaxAttempts {
			return nil, last
		}
		wait := retry.Policy{Initial: c.o.InitialBackoff, Max: c.o.MaxBackoff}.Delay(attempt)
		if ra, ok := retryAfter(respHeader, time.Now()); ok && ra > wait {
			wait = ra
		}
		if d, ok := ctx.Deadline(); ok && time.Until(d) < wait {
			return nil, last // the wait would outlast the caller's deadline
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, errors.Join(ctx.Err(), last)
		case <-t.C:
		}
	}
}

// retryAfter reads a Retry-After header: delay-seconds or an HTTP date
// (RFC 9110 §10.2.3).
func retryAfter(h http.Header, now time.Time) (time.Duration, bool) {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	if s, err := strconv.Atoi(v); err == nil && s >= 0 {
		return time.Duration(s) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}

// retryable says whether an answer's status may change on a retry.
func retryable(status int) bool {
	switch status {
	case http.StatusTooManyRequests, http.StatusInternalServerError, http.StatusBadGateway,
		http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// post sends one attempt and reads the whole answer.
func (c *Client) post(ctx context.Context, header http.Header, body []byte) (int, http.Header, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.endpoint, bytes.NewReader(body))
	if err != nil {
		return 0, nil, nil, err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := c.o.HTTPClient.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		// The status arrived, the body did not: as good as lost.
		return 0, nil, nil, fmt.Errorf("read the answer: %w", err)
	}
	return resp.StatusCode, resp.Header, b, nil
}

// encode writes the request's headers and body once, for every attempt.
func (c *Client) encode(events []*event.Event, batch bool) (http.Header, []byte, error) {
	h := http.Header{}
	if c.o.Mode == ModeEnvelope {
		var (
			b   []byte
			err error
		)
		if batch {
			b, err = json.Marshal(events)
		} else {
			b, err = json.Marshal(events[0])
		}
		if err != nil {
			return nil, nil, fmt.Errorf("client: encode the envelope: %w", err)
		}
		h.Set("Content-Type", "application/json")
		return h, b, nil
	}
	if batch {
		ces := make([]map[string]any, len(events))
		for i, e := range events {
			ces[i] = structured(e)
		}
		b, err := json.Marshal(ces)
		if err != nil {
			return nil, nil, fmt.Errorf("client: encode the CloudEvents batch: %w", err)
		}
		h.Set("Content-Type", mediaTypeCloudEventsBatch)
		return h, b, nil
	}
	if c.o.Mode == ModeStructured {
		b, err := json.Marshal(structured(events[0]))
		if err != nil {
			return nil, nil, fmt.Errorf("client: encode the CloudEvent: %w", err)
		}
		h.Set("Content-Type", mediaTypeCloudEventsJSON)
		return h, b, nil
	}
	return binaryHeaders(events[0]), events[0].Payload, nil
}

// decodeAnswer reads publish's answer: results on 2xx, a typed error
// otherwise.
func decodeAnswer(status int, body []byte, batch bool, n int) ([]Result, error) {
	if status >= 200 && status < 300 {
		var rs []Result
		if batch {
			var br struct {
				Results []Result `json:"results"`
			}
			if err := json.Unmarshal(body, &br); err != nil {
				return nil, fmt.Errorf("client: publish answered %d with a body that is not its batch answer: %w", status, err)
			}
			rs = br.Results
		} else {
			var r Result
			if err := json.Unmarshal(body, &r); err != nil {
				return nil, fmt.Errorf("client: publish answered %d with a body that is not its answer: %w", status, err)
			}
			rs = []Result{r}
		}
		if len(rs) != n {
			return nil, fmt.Errorf("client: publish answered %d results for %d events", len(rs), n)
		}
		return rs, nil
	}
	var er errorBody
	if err := json.Unmarshal(body, &er); err != nil || er.Error == "" {
		// Not publish's own answer (a proxy, Cloud Run's front end).
		msg := strings.TrimSpace(string(body))
		if len(msg) > 512 {
			msg = msg[:512]
		}
		er = errorBody{Error: "http_" + strconv.Itoa(status), Message: msg}
	}
	ae := APIError{StatusCode: status, Code: er.Error, Message: er.Message, Attempts: 1}
	switch {
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		return nil, &AuthError{APIError: ae, Topic: er.Topic, Caller: er.Caller}
	case status == http.StatusConflict:
		return nil, &ConflictError{APIError: ae, Fields: er.Fields}
	case status == http.StatusBadRequest || status == http.StatusRequestEntityTooLarge:
		return nil, &InvalidError{APIError: ae, Fields: er.Fields}
	}
	return nil, &ae
}

// errorBody is publish's error answer.
type errorBody struct {
	Error   string         `json:"error"`
	Message string         `json:"message"`
	Fields  []FieldProblem `json:"fields"`
	Topic   string         `json:"topic"`
	Caller  string         `json:"caller"`
}

// skipped returns a *SkippedError for the skipped results, or nil.
func skipped(rs []Result) error {
	var s []Result
	for _, r := range rs {
		if r.Status == StatusSkipped {
			s = append(s, r)
		}
	}
	if len(s) == 0 {
		return nil
	}
	return &SkippedError{Skipped: s}
}
