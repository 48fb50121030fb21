package forward_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"golang.org/x/oauth2"

	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/forward"
)

// recorder is an HTTP service that records every request it gets.
type recorder struct {
	*httptest.Server
	mu   sync.Mutex
	seen []string // "METHOD body signature"
}

func newRecorder(t *testing.T, answer func(w http.ResponseWriter, r *http.Request)) *recorder {
	rc := &recorder{}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		rc.seen = append(rc.seen, r.Method+" "+string(body)+" "+r.Header.Get(forward.HeaderWebhookSig))
		rc.mu.Unlock()
		answer(w, r)
	}))
	t.Cleanup(rc.Close)
	return rc
}

func (rc *recorder) requests() []string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]string(nil), rc.seen...)
}

// TestRedirectsAreFailuresNotFollowed: a 302 used to be followed as a
// bodiless GET that answered 200, so the event counted as delivered and
// was lost; a 307 re-sent the body and its signature to the host it named.
// Each redirect is now a transient failure naming the status and the
// host, and the host it points to gets nothing.
func TestRedirectsAreFailuresNotFollowed(t *testing.T) {
	elsewhere := newRecorder(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	for _, status := range []int{http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther, http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		target := newRecorder(t, func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, elsewhere.URL+"/collect?token=abc", status)
		})
		f, err := forward.New(forward.Options{URL: target.URL, Auth: forward.AuthHMAC, Secrets: []string{forward.NewSecret()}})
		if err != nil {
			t.Fatal(err)
		}
		err = f.Handle(context.Background(), ctxFor())
		class, code := consumer.Classify(err)
		if err == nil || class != consumer.ClassTransient || code != "forward_"+itoa(status) {
			t.Fatalf("%d: %v (class %d, code %q), want a transient failure forward_%d", status, err, class, code, status)
		}
		host := strings.TrimPrefix(elsewhere.URL, "http://")
		if msg := err.Error(); !strings.Contains(msg, "answered "+itoa(status)+" "+http.StatusText(status)) || !strings.Contains(msg, "redirect to "+host) ||
			strings.Contains(msg, "token=abc") {
			t.Errorf("%d: %q, want the status, its text and the host it redirects to, not its path or query", status, msg)
		}
		if got := target.requests(); len(got) != 1 || !strings.HasPrefix(got[0], "POST {") {
			t.Errorf("%d: the target got %q, want the one POST", status, got)
		}
	}
	if got := elsewhere.requests(); len(got) != 0 {
		t.Errorf("the host the redirects named got %q, want nothing", got)
	}
}

// TestCredentialsNeedHTTPS: a forwarder that signs, sends an ID token, a
// URL with a password or an Authorization header refuses a plain http URL
// to another machine; loopback (a developer's machine) and https pass.
func TestCredentialsNeedHTTPS(t *testing.T) {
	for _, tc := range []struct {
		o    forward.Options
		want string // "" = accepted
	}{
		{forward.Options{URL: "http://hooks.example.com/in", Auth: forward.AuthHMAC, Secrets: []string{forward.NewSecret()}}, "a signature (FORWARD_AUTH=hmac)"},
		{forward.Options{URL: "http://hooks.example.com/in", Auth: forward.AuthGoogle, TokenSource: staticToken{}}, "a Google ID token"},
		{forward.Options{URL: "http://user:pw@hooks.example.com/in"}, "the URL's user and password"},
		{forward.Options{URL: "http://hooks.example.com/in", Header: http.Header{"Authorization": {"Bearer x"}}}, "an Authorization header"},
		{forward.Options{URL: "https://hooks.example.com/in", Auth: forward.AuthHMAC, Secrets: []string{forward.NewSecret()}}, ""},
		{forward.Options{URL: "http://127.0.0.1:8080/in", Auth: forward.AuthHMAC, Secrets: []string{forward.NewSecret()}}, ""},
		{forward.Options{URL: "http://localhost/in", Auth: forward.AuthGoogle, TokenSource: staticToken{}}, ""},
		{forward.Options{URL: "http://[::1]/in", Header: http.Header{"Authorization": {"Bearer x"}}}, ""},
		{forward.Options{URL: "http://hooks.example.com/in"}, ""},
		{forward.Options{URL: "ftp://hooks.example.com/in"}, "absolute http(s) URL"},
		{forward.Options{URL: "/in"}, "absolute http(s) URL"},
	} {
		_, err := forward.New(tc.o)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s (auth %q): refused: %v", tc.o.URL, tc.o.Auth, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s (auth %q): %v, want a refusal naming %q", tc.o.URL, tc.o.Auth, err, tc.want)
		case tc.want != "" && strings.Contains(err.Error(), "pw"):
			t.Errorf("the refusal shows the password: %v", err)
		}
	}
}

type staticToken struct{}

func (staticToken) Token() (*oauth2Token, error) { return &oauth2Token{AccessToken: "id-token"}, nil }

// TestErrorsShowNoURLOrAnswerBody: what an attempt records (and the
// ledger, the console and the logs show) is the status and its text, or
// why the target did not answer; never the URL's password or query, nor
// the body the target answered, which may echo the request.
func TestErrorsShowNoURLOrAnswerBody(t *testing.T) {
	echo := newRecorder(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = w.Write([]byte("upstream failed on " + r.URL.String() + " with " + string(body) + " auth " + r.Header.Get("Authorization")))
	})
	secretURL := strings.Replace(echo.URL, "http://", "http://svc:hunter2@", 1) + "/in?api_key=k-123"
	f, err := forward.New(forward.Options{URL: secretURL})
	if err != nil {
		t.Fatal(err)
	}
	err = f.Handle(context.Background(), ctxFor())
	if err == nil || !strings.HasSuffix(err.Error(), ": forward: the target answered 500 Internal Server Error") {
		t.Errorf("got %v, want exactly the status and its text", err)
	}
	down, err := forward.New(forward.Options{URL: "http://svc:hunter2@127.0.0.1:1/in?api_key=k-123"})
	if err != nil {
		t.Fatal(err)
	}
	err = down.Handle(context.Background(), ctxFor())
	if _, code := consumer.Classify(err); code != "forward_unreachable" {
		t.Fatalf("unreachable: %v", err)
	}
	for _, leak := range []string{"hunter2", "svc:", "api_key", "k-123", "orderId"} {
		if strings.Contains(err.Error(), leak) {
			t.Errorf("unreachable: %q shows %q", err.Error(), leak)
		}
	}
	if !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("unreachable: %q does not say why", err.Error())
	}
}

type oauth2Token = oauth2.Token

func itoa(n int) string { return strconv.Itoa(n) }
