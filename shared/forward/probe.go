package forward

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// ProbeRequest is the request that asks a target whether it is up, sent
// while a consumer's delivery is paused by its breaker
// (Forwarder.ProbeTarget; the topology's forward_probe).
type ProbeRequest struct {
	// Method is the request's method (HEAD when empty).
	Method string
	// Path replaces the target URL's path ("" keeps the URL's own); the
	// URL's host and query stay.
	Path string
}

// ParseProbe reads a probe request written "METHOD /path", "METHOD" or
// "/path" (FORWARD_PROBE, the topology's forward_probe); "" is the default
// (HEAD of the target URL).
func ParseProbe(s string) (ProbeRequest, error) {
	var p ProbeRequest
	for _, f := range strings.Fields(s) {
		switch {
		case strings.HasPrefix(f, "/") && p.Path == "":
			p.Path = f
		case p.Method == "" && p.Path == "" && validMethod(f):
			p.Method = f
		default:
			return ProbeRequest{}, fmt.Errorf("forward_probe %q: want \"METHOD /path\", \"METHOD\" or \"/path\" (METHOD one of GET, HEAD, POST, OPTIONS; the path starting with /)", s)
		}
	}
	return p, nil
}

func validMethod(m string) bool {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodOptions:
		return true
	}
	return false
}

// ProbeResult is what a probe found.
type ProbeResult struct {
	// Up: the target answered, and not with an answer that says it is
	// down (5xx, 408, 429, the breaker's rule): any other answer, a 404
	// included, counts as up.
	Up bool
	// Status is the target's answer (0: no answer).
	Status int
	// RetryAfter is the target's Retry-After on a down answer.
	RetryAfter time.Duration
	// Reason says what the probe found, without the URL.
	Reason string
}

// ProbeTarget sends the probe request (Options.Probe) to the target, with
// the forwarder's headers and credentials, and reports the outcome to the
// breaker (Breaker.Probed: up closes it, down keeps it open for the next
// cool-down). It is how a consumer whose delivery its breaker paused
// finds that the target is back, with no delivery to probe with.
func (f *Forwarder) ProbeTarget(ctx context.Context) ProbeResult {
	ctx, cancel := context.WithTimeout(ctx, f.o.Timeout)
	defer cancel()
	res := f.probe(ctx)
	now := f.o.Now()
	if tr := f.breaker.Probed(now, !res.Up, res.RetryAfter, res.Reason); tr != nil {
		f.transition(ctx, tr)
	}
	return res
}

func (f *Forwarder) probe(ctx context.Context) ProbeResult {
	u, err := url.Parse(f.o.URL)
	if err != nil {
		return ProbeResult{Reason: "FORWARD_URL does not make a request"}
	}
	if f.o.Probe.Path != "" {
		u.Path, u.RawPath = f.o.Probe.Path, ""
	}
	method := f.o.Probe.Method
	if method == "" {
		method = http.MethodHead
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), nil)
	if err != nil {
		return ProbeResult{Reason: "the probe does not make a request"}
	}
	for k, vs := range f.o.Header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	req.Header.Set(HeaderConsumer, f.o.Name)
	switch f.o.Auth {
	case AuthGoogle:
		tok, err := f.o.TokenSource.Token()
		if err != nil {
			return ProbeResult{Reason: "no ID token for the probe: " + err.Error()}
		}
		req.Header.Set("Authorization", "Bearer "+tok.AccessToken)
	case AuthHMAC:
		ts := strconv.FormatInt(f.o.Now().Unix(), 10)
		id := "relaybus-probe-" + ts
		req.Header.Set(HeaderWebhookID, id)
		req.Header.Set(HeaderWebhookTime, ts)
		req.Header.Set(HeaderWebhookSig, sign(f.keys, id, ts, nil))
	}
	resp, err := f.o.Client.Do(req)
	if err != nil {
		return ProbeResult{Reason: "no answer: " + f.reason(ctx, err)}
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	res := ProbeResult{Up: !down(resp.StatusCode), Status: resp.StatusCode, Reason: fmt.Sprintf("answered %d", resp.StatusCode)}
	if !res.Up {
		res.RetryAfter = RetryAfter(resp.Header.Get("Retry-After"), f.o.Now())
	}
	return res
}
