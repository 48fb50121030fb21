package main

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// seen records the requests a server got and the credentials they held.
type seen struct {
	mu   sync.Mutex
	reqs []string
}

func (s *seen) handler(answer func(w http.ResponseWriter, r *http.Request)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.reqs = append(s.reqs, r.URL.Path+" token="+r.Header.Get("X-Relaybus-Token")+" auth="+r.Header.Get("Authorization"))
		s.mu.Unlock()
		answer(w, r)
	})
}

func (s *seen) list() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.reqs...)
}

// refuse is a transport that records the URL it was asked for and fails.
type refuse struct{ asked []string }

func (r *refuse) RoundTrip(req *http.Request) (*http.Response, error) {
	r.asked = append(r.asked, req.URL.String())
	return nil, errors.New("no network in this test")
}

// TestTokenGoesOnlyToItsHTTPSAPI: with a token, an http:// API on another
// machine is refused before anything is sent (loopback, as make dev's
// API, is fine); a redirect to another host is refused and the host it
// names gets nothing, while a redirect on the API's own host is followed.
func TestTokenGoesOnlyToItsHTTPSAPI(t *testing.T) {
	t.Setenv("RELAYBUS_TOKEN", "")
	t.Setenv("RELAYBUS_API", "")
	t.Setenv("RELAYBUS_GCLOUD", "/nonexistent/gcloud") // never a real one
	rt := &refuse{}
	hc := &http.Client{Transport: rt}
	call := func(hc *http.Client, args ...string) (int, string) {
		var out, errOut bytes.Buffer
		code := run(context.Background(), args, &out, &errOut, hc)
		return code, errOut.String()
	}
	for _, args := range [][]string{
		{"--api", "http://ops.example.com/dlqreplay", "--token", "s3cret", "whoami"},
		{"--url", "http://10.0.0.7:8080/dlqreplay", "--gcloud-auth", "whoami"},
	} {
		code, errOut := call(hc, args...)
		if code != 2 || !strings.Contains(errOut, "only to an https API (http:// only for a loopback address)") {
			t.Errorf("%v: exit %d, %q; want 2 and the rule", args, code, errOut)
		}
	}
	if len(rt.asked) != 0 {
		t.Errorf("requests were sent: %v", rt.asked)
	}
	if code, errOut := call(hc, "--api", "http://ops.example.com/dlqreplay", "whoami"); code != 1 || !strings.Contains(errOut, "no network in this test") {
		t.Errorf("no token, http: exit %d, %q; want the request tried", code, errOut)
	}
	if code, errOut := call(hc, "--api", "http://127.0.0.1:9/dlqreplay", "--token", "s3cret", "whoami"); code != 1 || !strings.Contains(errOut, "no network in this test") {
		t.Errorf("token, loopback: exit %d, %q; want the request tried", code, errOut)
	}

	var other, api seen
	elsewhere := httptest.NewServer(other.handler(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte(`{"caller": "x"}`)) }))
	defer elsewhere.Close()
	srv := httptest.NewTLSServer(api.handler(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/away/whoami":
			http.Redirect(w, r, elsewhere.URL+"/whoami", http.StatusTemporaryRedirect)
		case "/moved/whoami":
			http.Redirect(w, r, "/dlqreplay/whoami", http.StatusFound)
		default:
			_, _ = w.Write([]byte(`{"caller": "ops@example.com", "auth": "token", "canWrite": true}`))
		}
	}))
	defer srv.Close()
	code, errOut := call(srv.Client(), "--api", srv.URL+"/away", "--token", "s3cret", "-o", "json", "whoami")
	if code != 1 || !strings.Contains(errOut, "redirected to "+elsewhere.URL) || !strings.Contains(errOut, "does not follow") {
		t.Errorf("redirect away: exit %d, %q; want 1 and the refusal naming the host", code, errOut)
	}
	if got := other.list(); len(got) != 0 {
		t.Errorf("the host the API redirected to got %v", got)
	}
	if code, errOut := call(srv.Client(), "--api", srv.URL+"/moved", "--token", "s3cret", "-o", "json", "whoami"); code != 0 {
		t.Errorf("redirect on the same host: exit %d, %q", code, errOut)
	}
	if got := api.list(); len(got) != 3 || got[2] != "/dlqreplay/whoami token=s3cret auth=" {
		t.Errorf("the API got %v, want the redirected call with its token", got)
	}
}
