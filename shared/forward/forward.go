// Package forward is the consumer handler that hands each event to a
// service in any language: it POSTs the event as a binary-mode CloudEvent
// (ce-* headers, the payload as body) to a URL and maps the answer to the
// consume error taxonomy: 2xx success; 408 and 429 transient; other 4xx
// permanent (the service refuses the event for good); 5xx, timeouts and
// network errors transient.
//
// # The call outside the transaction
//
// The forwarder is a consumer.Remote handler: the engine does not hold a
// Postgres transaction (or connection) open while the target takes its
// time. Each attempt goes through the inbox's claim states:
//
//	claimed   the attempt is counted and the event claimed with a lease
//	          (Lease: the call's timeout + LeaseMargin), committed
//	   |
//	   | the call, no transaction open
//	   v
//	applied   2xx: the claim becomes applied and the success attempt is
//	          recorded, in one statement; later deliveries are duplicates
//	(released) otherwise: the claim is deleted and the failed attempt
//	          recorded; a transient failure answers 503 and Pub/Sub
//	          redelivers
//
// A delivery that finds a live claim (another instance is calling) answers
// 503 and comes back later; one that finds an expired claim (the process
// holding it died after claiming, maybe after calling) takes it over,
// records the old attempt as retry "abandoned", and calls again. So no
// effect is lost, the outcome is recorded once, and the target may see one
// event more than once: it must be idempotent on the event id, which every
// request carries as Ce-Id and Idempotency-Key (and webhook-id when
// signed).
//
// # Authentication and tracing
//
// Per consumer (Options.Auth, FORWARD_AUTH):
//
//   - AuthNone: no credentials (a target on a private network, or one that
//     checks Options.Header);
//   - AuthGoogle: "Authorization: Bearer <ID token>", a Google-signed ID
//     token for Options.Audience (the target's URL by default) from
//     idtoken.NewTokenSource: on Cloud Run the service's own identity from
//     the metadata server, elsewhere Application Default Credentials. A
//     Cloud Run target behind IAM lets it through when that identity has
//     roles/run.invoker; any other target verifies it against Google's keys
//     (idtoken.Validate) and checks the audience and the caller's email.
//   - AuthHMAC: the Standard Webhooks scheme (the one Svix documents and
//     Convoy's advanced signatures follow): headers webhook-id (the event
//     id), webhook-timestamp (Unix seconds of this attempt) and
//     webhook-signature "v1,<base64 HMAC-SHA256 of
//     `<webhook-id>.<webhook-timestamp>.<body>`>", keyed with the secret's
//     bytes (a secret is "whsec_" + base64 of 24 to 64 random bytes;
//     several secrets, space-separated, sign with each, for rotation). The
//     target recomputes the signature over the raw body, compares in
//     constant time and refuses a timestamp outside its tolerance (5
//     minutes, DefaultTolerance): see Verify.
//
// Credentials go over TLS only: with AuthGoogle, AuthHMAC, a user and
// password in the URL, or an Authorization or Cookie header in
// Options.Header, the URL must be https (http:// is accepted for a
// loopback target, as on a developer's machine).
//
// # What the ledger sees
//
// Redirects are not followed: a 3xx answer is a transient failure naming
// the status (and the host it points to), since following one would turn
// the POST into a bodiless GET (302, 303) or send the body, its signature
// and its token to wherever the target points (307, 308). An attempt's
// error, which the ledger, the console and the logs show, carries the
// target's status and its standard text, or a short reason it did not
// answer, never the URL (which may hold credentials or a token in its
// query) nor the body the target answered (which may echo the request).
//
// Every request carries W3C trace context: "traceparent:
// 00-<the event's trace id>-<its span id>-01" when the trace id is 32 hex
// digits (the span id is made up when the event has none that fits), so
// the target's spans join the event's trace.
package forward

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"golang.org/x/oauth2"
	"google.golang.org/api/idtoken"

	"github.com/relaybus/relaybus/internal/cloudevent"
	"github.com/relaybus/relaybus/internal/logging"
	"github.com/relaybus/relaybus/internal/telemetry"
	"github.com/relaybus/relaybus/internal/traceparent"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/event"
)

// DefaultTimeout bounds one forward.
const DefaultTimeout = 10 * time.Second

// LeaseMargin is added to the call's timeout to make a claim's lease: the
// time to record the outcome after the call.
const LeaseMargin = 5 * time.Second

// Authentication modes (Options.Auth, FORWARD_AUTH).
const (
	AuthNone   = "none"
	AuthGoogle = "google"
	AuthHMAC   = "hmac"
)

// Headers the forwarder sets besides the CloudEvent's ce-* headers.
const (
	HeaderTraceparent    = "Traceparent"
	HeaderIdempotencyKey = "Idempotency-Key"
	HeaderWebhookID      = "Webhook-Id"
	HeaderWebhookTime    = "Webhook-Timestamp"
	HeaderWebhookSig     = "Webhook-Signature"
	HeaderConsumer       = "X-Relaybus-Consumer"
	HeaderAttempt        = "X-Relaybus-Attempt"
)

// Options configure a forwarder. URL is required.
type Options struct {
	// URL receives the events.
	URL string
	// Client sends the requests (a client with Timeout when nil).
	Client *http.Client
	// Timeout bounds one request (DefaultTimeout).
	Timeout time.Duration
	// Header is added to every request.
	Header http.Header
	// Auth is AuthNone (the default), AuthGoogle or AuthHMAC.
	Auth string
	// Audience is the ID tokens' audience with AuthGoogle (URL when empty;
	// a Cloud Run service expects its own URL, or a custom audience it
	// declares).
	Audience string
	// TokenSource mints the ID tokens with AuthGoogle
	// (idtoken.NewTokenSource for Audience when nil).
	TokenSource oauth2.TokenSource
	// Secrets sign the requests with AuthHMAC: each "whsec_" + base64 of
	// 24 to 64 bytes; every one signs (rotation).
	Secrets []string
	// Now is the clock of webhook-timestamp and of the breaker
	// (time.Now).
	Now func() time.Time
	// Breaker configures the circuit breaker that holds deliveries back
	// while the target is down (see "The circuit breaker"; the defaults
	// when zero, off with a negative Threshold).
	Breaker BreakerOptions
	// Name names the consumer in the breaker's logs and metrics.
	Name string
	// OnTransition, when set, is called after each change of the
	// breaker's state (after its log line and metric), on the goroutine of
	// the call that made it: it must not block (consume starts the pause
	// of its delivery from it).
	OnTransition func(context.Context, Transition)
	// Probe is the request ProbeTarget sends while the consumer's delivery
	// is paused (HEAD of URL when zero).
	Probe ProbeRequest
	// Logger receives a line at each change of the breaker's state
	// (logging.Discard when nil).
	Logger *slog.Logger
}

// Forwarder is the forwarding handler; it is a consumer.Remote and a
// consumer.Gate (its circuit breaker).
type Forwarder struct {
	o       Options
	breaker *Breaker
	keys    [][]byte
	// secrets are the parts of the URL an error must not show.
	secrets []string
}

// New returns a handler that forwards every event to o.URL. It refuses a
// URL that is not absolute http(s), and an http:// URL to a host that is
// not loopback when the requests carry credentials.
func New(o Options) (*Forwarder, error) {
	if o.URL == "" {
		return nil, errors.New("forward: Options.URL is required (FORWARD_URL)")
	}
	u, err := url.Parse(o.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, errors.New("forward: FORWARD_URL must be an absolute http(s) URL")
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	// Redirects are answers, never followed (see the package doc).
	client := http.Client{Timeout: o.Timeout}
	if o.Client != nil {
		client = *o.Client
	}
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	o.Client = &client
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = logging.Discard()
	}
	if o.Breaker.ProbeTimeout <= 0 {
		o.Breaker.ProbeTimeout = o.Timeout + LeaseMargin
	}
	f := &Forwarder{o: o, breaker: NewBreaker(o.Breaker), secrets: []string{o.URL}}
	if u.User != nil {
		f.secrets = append(f.secrets, u.User.String())
	}
	if u.RawQuery != "" {
		f.secrets = append(f.secrets, u.RawQuery)
	}
	if what := credentials(o, u); what != "" && u.Scheme != "https" && !loopback(u.Hostname()) {
		return nil, fmt.Errorf("forward: FORWARD_URL must be https: the requests carry %s (http:// only for a loopback target)", what)
	}
	switch o.Auth {
	case "", AuthNone:
		if len(o.Secrets) > 0 {
			return nil, errors.New("forward: signing secrets are set but FORWARD_AUTH is not hmac")
		}
	case AuthGoogle:
		if f.o.Audience == "" {
			f.o.Audience = o.URL
		}
		if f.o.TokenSource == nil {
			ts, err := idtoken.NewTokenSource(context.Background(), f.o.Audience)
			if err != nil {
				return nil, fmt.Errorf("forward: FORWARD_AUTH=google: ID tokens for audience %q: %w", f.o.Audience, err)
			}
			f.o.TokenSource = ts
		}
	case AuthHMAC:
		if len(o.Secrets) == 0 {
			return nil, errors.New("forward: FORWARD_AUTH=hmac needs a signing secret (FORWARD_SIGNING_SECRET)")
		}
		for i, s := range o.Secrets {
			k, err := ParseSecret(s)
			if err != nil {
				return nil, fmt.Errorf("forward: signing secret %d: %w", i+1, err)
			}
			f.keys = append(f.keys, k)
		}
	default:
		return nil, fmt.Errorf("forward: FORWARD_AUTH=%q: must be none, google or hmac", o.Auth)
	}
	return f, nil
}

// credentials names what credentials the requests carry, "" for none.
func credentials(o Options, u *url.URL) string {
	switch {
	case o.Auth == AuthGoogle:
		return "a Google ID token (FORWARD_AUTH=google)"
	case o.Auth == AuthHMAC:
		return "a signature (FORWARD_AUTH=hmac)"
	case u.User != nil:
		return "the URL's user and password"
	}
	for _, h := range []string{"Authorization", "Proxy-Authorization", "Cookie"} {
		if o.Header.Get(h) != "" {
			return "an " + h + " header"
		}
	}
	return ""
}

// loopback reports whether host is this machine (localhost, 127.0.0.0/8,
// ::1).
func loopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Lease is how long a claim of this forwarder stands: the call's timeout
// plus LeaseMargin (consumer.Remote).
func (f *Forwarder) Lease() time.Duration { return f.o.Timeout + LeaseMargin }

// Handle forwards c's event and maps the answer (consumer.Handler).
func (f *Forwarder) Handle(ctx context.Context, c *consumer.Context) error {
	ctx, cancel := context.WithTimeout(ctx, f.o.Timeout)
	defer cancel()
	req, err := f.Request(ctx, c)
	if err != nil {
		return err
	}
	resp, err := f.o.Client.Do(req)
	if err != nil {
		reason := f.reason(ctx, err)
		if held := f.done(ctx, true, 0, "no answer: "+reason); held != nil {
			return held
		}
		return consumer.Transient("forward_unreachable", errors.New("forward: the target did not answer: "+reason))
	}
	// Read a little of the body so the connection can be reused; what the
	// target says in it is not kept.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	var wait time.Duration
	if down(resp.StatusCode) {
		wait = RetryAfter(resp.Header.Get("Retry-After"), f.o.Now())
	}
	if held := f.done(ctx, down(resp.StatusCode), wait, fmt.Sprintf("answered %d", resp.StatusCode)); held != nil {
		return held
	}
	return classify(resp.StatusCode, resp.Header.Get("Location"))
}

// down reports whether a status says the target is down or overloaded,
// rather than judging the one event: 5xx, 408 and 429.
func down(status int) bool {
	return status >= 500 || status == http.StatusRequestTimeout || status == http.StatusTooManyRequests
}

// Admit lets a delivery through unless the breaker is open
// (consumer.Gate): then it returns a *consumer.HeldError saying how long
// until the next probe, and the engine answers without an attempt.
func (f *Forwarder) Admit(ctx context.Context) (func(called bool), error) {
	ok, probe, wait, tr := f.breaker.Allow(f.o.Now())
	if tr != nil {
		f.transition(ctx, tr)
	}
	if !ok {
		return nil, &consumer.HeldError{RetryAfter: wait,
			Reason: fmt.Sprintf("forward: the target is down (circuit breaker open); delivery held, no attempt made; next probe within %s", wait.Round(time.Millisecond))}
	}
	if !probe {
		return nil, nil
	}
	return func(called bool) {
		if !called {
			f.breaker.Cancel(true)
		}
	}, nil
}

// EndCoolDown ends the breaker's cool-down: the next delivery probes the
// target (Breaker.EndCoolDown).
func (f *Forwarder) EndCoolDown() { f.breaker.EndCoolDown(f.o.Now()) }

// BreakerState is the breaker's state now (Closed when it is off).
func (f *Forwarder) BreakerState() State { return f.breaker.State(f.o.Now()) }

// done reports a call's outcome to the breaker. When the call found the
// target down and the breaker is open after it (this call opened it, or
// was the failed probe), it returns the *consumer.HeldError Handle
// returns: the engine counts no attempt (the target is down, the event
// is not at fault).
func (f *Forwarder) done(ctx context.Context, down bool, retryAfter time.Duration, reason string) error {
	now := f.o.Now()
	if tr := f.breaker.Done(now, down, retryAfter, reason); tr != nil {
		f.transition(ctx, tr)
	}
	if !down {
		return nil
	}
	if held, wait := f.breaker.Held(now); held {
		return &consumer.HeldError{RetryAfter: wait,
			Reason: fmt.Sprintf("forward: the target is down (%s); circuit breaker open: not counted as an attempt; next probe within %s", reason, wait.Round(time.Millisecond))}
	}
	return nil
}

// transition logs and counts a change of the breaker's state.
func (f *Forwarder) transition(ctx context.Context, tr *Transition) {
	if f.o.OnTransition != nil {
		defer f.o.OnTransition(ctx, *tr)
	}
	telemetry.RecordBreaker(ctx, f.o.Name, tr.From.String(), tr.To.String())
	attrs := []any{"consumer_id", f.o.Name, "from", tr.From.String(), "to", tr.To.String(), "failures", tr.Failures}
	switch tr.To {
	case Open:
		f.o.Logger.WarnContext(ctx, "forward: circuit breaker open; deliveries held without spending their attempts",
			append(attrs, "cool_down", tr.CoolDown.String(), "reason", tr.Reason)...)
	case HalfOpen:
		f.o.Logger.InfoContext(ctx, "forward: circuit breaker half-open; one delivery probes the target", attrs...)
	default:
		f.o.Logger.InfoContext(ctx, "forward: circuit breaker closed; the target answers again", append(attrs, "reason", tr.Reason)...)
	}
}

// maxReason bounds the reason an unreachable target's error gives.
const maxReason = 200

// reason says why a request got no answer, without the URL: the
// transport's error inside the *url.Error, with any part of the URL it
// quotes taken out.
func (f *Forwarder) reason(ctx context.Context, err error) string {
	if ctx.Err() != nil {
		return fmt.Sprintf("no answer within %s (FORWARD_TIMEOUT)", f.o.Timeout)
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		if ue.Timeout() {
			return fmt.Sprintf("no answer within %s (FORWARD_TIMEOUT)", f.o.Timeout)
		}
		err = ue.Err
	}
	msg := err.Error()
	for _, s := range f.secrets {
		msg = strings.ReplaceAll(msg, s, "…")
	}
	if len(msg) > maxReason {
		msg = msg[:maxReason] + "…"
	}
	return msg
}

// Request builds the request that forwards c's event: the binary-mode
// CloudEvent, the dedup, trace and relaybus headers, and the credentials.
func (f *Forwarder) Request(ctx context.Context, c *consumer.Context) (*http.Request, error) {
	ce := cloudevent.FromEvent(c.Event)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.o.URL, nil)
	if err != nil {
		return nil, consumer.Permanent("forward_url", errors.New("forward: FORWARD_URL does not make a request"))
	}
	if err := cehttp.WriteRequest(ctx, binding.ToMessage(&ce), req); err != nil {
		return nil, consumer.Permanent("forward_encode", fmt.Errorf("forward: encode: %w", err))
	}
	var body []byte
	if req.Body != nil {
		if body, err = io.ReadAll(req.Body); err != nil {
			return nil, consumer.Permanent("forward_encode", fmt.Errorf("forward: encode: %w", err))
		}
		req.Body.Close()
	}
	req.Body = io.NopCloser(bytes.NewReader(body))
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	req.ContentLength = int64(len(body))
	for k, vs := range f.o.Header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	req.Header.Set(HeaderConsumer, c.ConsumerID)
	req.Header.Set(HeaderAttempt, strconv.Itoa(c.Attempt))
	req.Header.Set(HeaderIdempotencyKey, c.Event.ID)
	// The consume span's context when telemetry records one (the endpoint's
	// spans join the event's trace under it), else one built from the event.
	if tp := traceparent.FromContext(req.Context()); tp != "" {
		req.Header.Set(HeaderTraceparent, tp)
	} else if tp := Traceparent(c.Event); tp != "" {
		req.Header.Set(HeaderTraceparent, tp)
	}
	switch f.o.Auth {
	case AuthGoogle:
		tok, err := f.o.TokenSource.Token()
		if err != nil {
			return nil, consumer.Transient("forward_auth", fmt.Errorf("forward: ID token for %s: %w", f.o.Audience, err))
		}
		req.Header.Set("Authorization", "Bearer "+tok.AccessToken)
	case AuthHMAC:
		ts := strconv.FormatInt(f.o.Now().Unix(), 10)
		req.Header.Set(HeaderWebhookID, c.Event.ID)
		req.Header.Set(HeaderWebhookTime, ts)
		req.Header.Set(HeaderWebhookSig, sign(f.keys, c.Event.ID, ts, body))
	}
	return req, nil
}

// Traceparent returns the W3C traceparent header for e: version 00, e's
// trace id, e's span id as the parent (a random one when e has none that
// fits) and the sampled flag; "" when e's trace id is not 32 hex digits
// (or is all zeros).
func Traceparent(e *event.Event) string {
	trace := strings.ToLower(e.TraceID)
	if !isHex(trace, 32) {
		return ""
	}
	span := strings.ToLower(e.SpanID)
	for !isHex(span, 16) {
		var b [8]byte
		_, _ = rand.Read(b[:])
		span = hex.EncodeToString(b[:])
	}
	return "00-" + trace + "-" + span + "-01"
}

func isHex(s string, n int) bool {
	if len(s) != n || allZero(s) {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

func allZero(s string) bool { return strings.Trim(s, "0") == "" }

// SecretPrefix starts a Standard Webhooks signing secret.
const SecretPrefix = "whsec_"

// ParseSecret returns a signing secret's key bytes: secret is "whsec_"
// (optional) followed by the standard base64 of 24 to 64 bytes.
func ParseSecret(secret string) ([]byte, error) {
	b, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(strings.TrimSpace(secret), SecretPrefix))
	if err != nil {
		return nil, fmt.Errorf("not %s followed by base64: %w", SecretPrefix, err)
	}
	if len(b) < 24 || len(b) > 64 {
		return nil, fmt.Errorf("the key is %d bytes; Standard Webhooks keys are 24 to 64 random bytes", len(b))
	}
	return b, nil
}

// NewSecret returns a fresh signing secret: "whsec_" + base64 of 32
// random bytes.
func NewSecret() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return SecretPrefix + base64.StdEncoding.EncodeToString(b[:])
}

// Signature is the v1 signature of a request: base64 of HMAC-SHA256 over
// "<id>.<timestamp>.<body>" keyed with key.
func Signature(key []byte, id, timestamp string, body []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id))
	m.Write([]byte{'.'})
	m.Write([]byte(timestamp))
	m.Write([]byte{'.'})
	m.Write(body)
	return base64.StdEncoding.EncodeToString(m.Sum(nil))
}

func sign(keys [][]byte, id, ts string, body []byte) string {
	sigs := make([]string, len(keys))
	for i, k := range keys {
		sigs[i] = "v1," + Signature(k, id, ts, body)
	}
	return strings.Join(sigs, " ")
}

// DefaultTolerance is how far a signed request's timestamp may be from the
// verifier's clock (Svix's libraries use the same 5 minutes).
const DefaultTolerance = 5 * time.Minute

// Verification failures.
var (
	ErrMissingHeaders = errors.New("forward: webhook-id, webhook-timestamp and webhook-signature are required")
	ErrTimestamp      = errors.New("forward: webhook-timestamp is outside the tolerance (a replay, or a clock off)")
	ErrSignature      = errors.New("forward: no webhook-signature matches")
)

// Verify checks a signed request the way a target should: the three
// headers are present, the timestamp is within tolerance of now
// (DefaultTolerance when 0), and one of the v1 signatures is the HMAC of
// "<webhook-id>.<webhook-timestamp>.<body>" under secret (compared in
// constant time). body is the raw request body, as received.
func Verify(secret string, h http.Header, body []byte, now time.Time, tolerance time.Duration) error {
	key, err := ParseSecret(secret)
	if err != nil {
		return err
	}
	id, ts, sigs := h.Get(HeaderWebhookID), h.Get(HeaderWebhookTime), h.Get(HeaderWebhookSig)
	if id == "" || ts == "" || sigs == "" {
		return ErrMissingHeaders
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return ErrTimestamp
	}
	if tolerance <= 0 {
		tolerance = DefaultTolerance
	}
	if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return ErrTimestamp
	}
	want := []byte(Signature(key, id, ts, body))
	for _, s := range strings.Fields(sigs) {
		v, sig, ok := strings.Cut(s, ",")
		if ok && v == "v1" && hmac.Equal([]byte(sig), want) {
			return nil
		}
	}
	return ErrSignature
}

// classify maps the target's status to the taxonomy. A redirect is a
// transient failure that names the host it points to (location's, without
// its path or credentials): the target or FORWARD_URL needs fixing, and
// the event is redelivered meanwhile, then dead-lettered.
func classify(status int, location string) error {
	err := fmt.Errorf("forward: the target answered %d %s", status, http.StatusText(status))
	switch {
	case status >= 200 && status < 300:
		return nil
	case status >= 300 && status < 400:
		to := ""
		if u, perr := url.Parse(location); perr == nil && u.Host != "" {
			to = " to " + u.Host
		}
		return consumer.Transient(fmt.Sprintf("forward_%d", status),
			fmt.Errorf("%w, a redirect%s, which relaybus does not follow: the event was not delivered (set FORWARD_URL to the address that takes it)", err, to))
	case status == http.StatusRequestTimeout || status == http.StatusTooManyRequests:
		return consumer.Transient(fmt.Sprintf("forward_%d", status), err)
	case status >= 400 && status < 500:
		return consumer.Permanent(fmt.Sprintf("forward_%d", status), err)
	}
	return consumer.Transient(fmt.Sprintf("forward_%d", status), err)
}

// Forwarders is the configuration the operators' API (dlqreplay) and the
// forwarders consume service share for the forwarders added at run time:
// the key their hmac signing secrets are sealed under, which dlqreplay
// seals with and the service opens with. Both functions' Config embed it.
type Forwarders struct {
	// ForwardersKey is RELAYBUS_FORWARDERS_KEY: the standard base64 of 32
	// random bytes; several, space-separated, while keys change (the
	// first seals, each opens what it sealed).
	ForwardersKey string `env:"RELAYBUS_FORWARDERS_KEY"`
}
