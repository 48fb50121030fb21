package forward

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

func TestParseProbe(t *testing.T) {
	for _, c := range []struct {
		in   string
		want ProbeRequest
		bad  bool
	}{
		{in: "", want: ProbeRequest{}},
		{in: "GET /healthz", want: ProbeRequest{Method: "GET", Path: "/healthz"}},
		{in: "  HEAD  ", want: ProbeRequest{Method: "HEAD"}},
		{in: "/status", want: ProbeRequest{Path: "/status"}},
		{in: "OPTIONS /", want: ProbeRequest{Method: "OPTIONS", Path: "/"}},
		{in: "DELETE /x", bad: true},
		{in: "get /x", bad: true},
		{in: "GET healthz", bad: true},
		{in: "/a /b", bad: true},
		{in: "/a GET", bad: true},
	} {
		got, err := ParseProbe(c.in)
		if (err != nil) != c.bad || got != c.want {
			t.Errorf("ParseProbe(%q) = %+v, %v; want %+v, error %v", c.in, got, err, c.want, c.bad)
		}
	}
}

func TestCoolDownAfter(t *testing.T) {
	o := BreakerOptions{CoolDown: 5 * time.Second, MaxCoolDown: time.Minute}
	for _, c := range []struct {
		failed int
		retry  time.Duration
		want   time.Duration
	}{
		{0, 0, 5 * time.Second},
		{1, 0, 10 * time.Second},
		{3, 0, 40 * time.Second},
		{4, 0, time.Minute},
		{100, 0, time.Minute},
		{0, 10 * time.Minute, 10 * time.Minute},
		{0, 2 * time.Hour, MaxRetryAfter},
	} {
		if got := o.CoolDownAfter(c.failed, c.retry); got != c.want {
			t.Errorf("CoolDownAfter(%d, %s) = %s, want %s", c.failed, c.retry, got, c.want)
		}
	}
	if got := (BreakerOptions{}).CoolDownAfter(0, 0); got != DefaultBreakerCoolDown {
		t.Errorf("the defaults' first cool-down %s, want %s", got, DefaultBreakerCoolDown)
	}
}

// A probe made outside the deliveries (the consumer is paused) drives the
// breaker: down opens it, or keeps it open for a doubled cool-down; up
// closes it; EndCoolDown lets the next delivery probe at once.
func TestBreakerProbedAndEndCoolDown(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC)
	b := NewBreaker(BreakerOptions{Threshold: 3, CoolDown: time.Second, MaxCoolDown: 10 * time.Second})
	if tr := b.Probed(t0, true, 0, "no answer"); tr == nil || tr.From != Closed || tr.To != Open || tr.CoolDown != time.Second {
		t.Fatalf("a down probe of a closed breaker: %+v, want closed→open for 1s", tr)
	}
	if tr := b.Probed(t0, true, 0, "no answer"); tr != nil || b.State(t0.Add(1500*time.Millisecond)) != Open {
		t.Fatalf("a second down probe: %+v, state %s at 1.5s; want no transition, open for 2s", tr, b.State(t0.Add(1500*time.Millisecond)))
	}
	b.EndCoolDown(t0)
	if ok, probe, _, _ := b.Allow(t0); !ok || !probe {
		t.Fatalf("after EndCoolDown: allow %v probe %v, want the next call to probe", ok, probe)
	}
	if tr := b.Probed(t0, false, 0, "answered 200"); tr == nil || tr.To != Closed || b.State(t0) != Closed {
		t.Fatalf("an up probe: %+v, want closed", tr)
	}
	if tr := b.Probed(t0, false, 0, "answered 200"); tr != nil {
		t.Fatalf("an up probe of a closed breaker: %+v, want none", tr)
	}
	var off *Breaker
	off.EndCoolDown(t0)
	if tr := off.Probed(t0, true, 0, ""); tr != nil {
		t.Fatal("a breaker that is off changed state")
	}
}

// ProbeTarget sends HEAD of the target URL by default, or the configured
// request to the URL's host (its query kept), with the forwarder's headers;
// any answer but a down one counts as up, and a down one's Retry-After is
// read.
func TestProbeTarget(t *testing.T) {
	var got []string
	status, retry := http.StatusNoContent, ""
	tg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Method+" "+r.URL.RequestURI()+" "+r.Header.Get("X-Team"))
		if retry != "" {
			w.Header().Set("Retry-After", retry)
		}
		w.WriteHeader(status)
	}))
	defer tg.Close()
	now := time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC)
	mk := func(p ProbeRequest) *Forwarder {
		f, err := New(Options{URL: tg.URL + "/events?token=x", Probe: p, Header: http.Header{"X-Team": {"a"}}, Now: func() time.Time { return now }})
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	ctx := context.Background()
	if r := mk(ProbeRequest{}).ProbeTarget(ctx); !r.Up || r.Status != 204 {
		t.Errorf("probe answered 204: %+v, want up", r)
	}
	status = http.StatusNotFound
	f := mk(ProbeRequest{Method: "GET", Path: "/healthz"})
	if r := f.ProbeTarget(ctx); !r.Up || r.Reason != "answered 404" {
		t.Errorf("probe answered 404: %+v, want up", r)
	}
	status, retry = http.StatusTooManyRequests, "120"
	if r := f.ProbeTarget(ctx); r.Up || r.RetryAfter != 2*time.Minute || f.BreakerState() != Open {
		t.Errorf("probe answered 429 Retry-After 120: %+v, breaker %s; want down for 2 minutes, open", r, f.BreakerState())
	}
	if want := []string{"HEAD /events?token=x a", "GET /healthz?token=x a", "GET /healthz?token=x a"}; len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Errorf("requests %q, want %q", got, want)
	}
	tg.Close()
	if r := f.ProbeTarget(ctx); r.Up || r.Status != 0 || r.Reason == "" {
		t.Errorf("probe of a stopped target: %+v, want down, no answer", r)
	}
}
