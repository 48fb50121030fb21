package forward_test

import (
	"context"
	"crypto"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/forward"
)

// verify is the Standard Webhooks verification a target writes, with the
// standard library only and nothing from package forward: the Go example of
// docs/forwarding.md, verbatim (TestTheDocsShowTheReferenceVerifier).
func verify(secret string, r *http.Request, body []byte) error {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		return err
	}
	id, ts, sigs := r.Header.Get("webhook-id"), r.Header.Get("webhook-timestamp"), r.Header.Get("webhook-signature")
	sec, err := strconv.ParseInt(ts, 10, 64)
	if id == "" || err != nil || sigs == "" {
		return errors.New("missing webhook headers")
	}
	if d := time.Since(time.Unix(sec, 0)); d > 5*time.Minute || d < -5*time.Minute {
		return errors.New("timestamp outside the 5-minute tolerance")
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id + "." + ts + "."))
	mac.Write(body)
	want := base64.StdEncoding.EncodeToString(mac.Sum(nil))
	for _, s := range strings.Split(sigs, " ") {
		if v, sig, ok := strings.Cut(s, ","); ok && v == "v1" && subtle.ConstantTimeCompare([]byte(sig), []byte(want)) == 1 {
			return nil // then apply the event once per webhook-id
		}
	}
	return errors.New("no signature matches")
}

// The docs' Go verifier (docs/forwarding.md) is this file's verify, so the
// one the tests run is the one users copy.
func TestTheDocsShowTheReferenceVerifier(t *testing.T) {
	src, err := os.ReadFile("sign_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, fn, _ := strings.Cut(string(src), "\nfunc verify(")
	fn, _, _ = strings.Cut(fn, "\n}\n")
	doc, err := os.ReadFile(forwardingDoc)
	if err != nil {
		t.Fatal(err)
	}
	if fn == "" || !strings.Contains(string(doc), "```go\nfunc verify("+fn+"\n}\n```") {
		t.Errorf("the Go verification example of %s is not this test's verify", forwardingDoc)
	}
}

// target is a local HTTP service that verifies what it receives with
// verify and answers 401 when it does not verify.
type target struct {
	*httptest.Server
	mu       sync.Mutex
	requests []*http.Request
	bodies   [][]byte
	refusals []error
}

func newTarget(t *testing.T, check func(r *http.Request, body []byte) error) *target {
	tg := &target{}
	tg.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		err := check(r, body)
		tg.mu.Lock()
		tg.requests, tg.bodies, tg.refusals = append(tg.requests, r), append(tg.bodies, body), append(tg.refusals, err)
		tg.mu.Unlock()
		if err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(tg.Close)
	return tg
}

func (tg *target) last() (*http.Request, []byte, error) {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	n := len(tg.requests) - 1
	return tg.requests[n], tg.bodies[n], tg.refusals[n]
}

func tracedCtx() *consumer.Context {
	c := ctxFor()
	c.Event.TraceID, c.Event.SpanID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	return c
}

// The forwarder's HMAC signatures verify with the documented scheme (a
// reference verifier written from the scheme, and forward.Verify); a
// wrong secret and an old timestamp are refused, and the forwarder takes
// the target's 401 as a permanent error; the target sees the event's
// traceparent and its id as the dedup key.
func TestHMACSignaturesVerifyAndOldOrForeignOnesAreRefused(t *testing.T) {
	secret := forward.NewSecret()
	other := forward.NewSecret()
	var mu sync.Mutex
	key := secret
	tg := newTarget(t, func(r *http.Request, body []byte) error { mu.Lock(); defer mu.Unlock(); return verify(key, r, body) })

	f, err := forward.New(forward.Options{URL: tg.URL, Auth: forward.AuthHMAC, Secrets: []string{secret}})
	if err != nil {
		t.Fatal(err)
	}
	c := tracedCtx()
	if err := f.Handle(context.Background(), c); err != nil {
		t.Fatalf("signed with the target's secret: %v", err)
	}
	r, body, _ := tg.last()
	if string(body) != `{"orderId":"order-1"}` {
		t.Errorf("body %s", body)
	}
	if err := forward.Verify(secret, r.Header, body, time.Now(), 0); err != nil {
		t.Errorf("forward.Verify refuses what the reference verifier accepts: %v", err)
	}
	if got := r.Header.Get("traceparent"); got != "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" {
		t.Errorf("traceparent %q", got)
	}
	if r.Header.Get("webhook-id") != "evt-1" || r.Header.Get("Idempotency-Key") != "evt-1" || r.Header.Get("Ce-Id") != "evt-1" {
		t.Errorf("dedup headers: webhook-id %q Idempotency-Key %q Ce-Id %q", r.Header.Get("webhook-id"), r.Header.Get("Idempotency-Key"), r.Header.Get("Ce-Id"))
	}
	// A tampered body fails.
	if err := verify(secret, r, []byte(`{"orderId":"order-2"}`)); err == nil {
		t.Error("a tampered body verified")
	}

	// The target's secret is not the forwarder's: refused, a permanent error.
	f, _ = forward.New(forward.Options{URL: tg.URL, Auth: forward.AuthHMAC, Secrets: []string{other}})
	err = f.Handle(context.Background(), tracedCtx())
	if class, code := consumer.Classify(err); err == nil || class != consumer.ClassPermanent || code != "forward_401" {
		t.Errorf("wrong secret: %v (class %d code %s), want the target's 401, permanent", err, class, code)
	}
	if _, _, refusal := tg.last(); refusal == nil {
		t.Error("the reference verifier accepted a foreign secret")
	}
	r, body, _ = tg.last()
	if err := forward.Verify(secret, r.Header, body, time.Now(), 0); !errors.Is(err, forward.ErrSignature) {
		t.Errorf("forward.Verify with the wrong secret: %v", err)
	}

	// A request signed 10 minutes ago (a replay, or a clock off): refused.
	f, _ = forward.New(forward.Options{URL: tg.URL, Auth: forward.AuthHMAC, Secrets: []string{secret},
		Now: func() time.Time { return time.Now().Add(-10 * time.Minute) }})
	if err := f.Handle(context.Background(), tracedCtx()); err == nil {
		t.Error("an old timestamp was accepted")
	}
	r, body, _ = tg.last()
	if err := forward.Verify(secret, r.Header, body, time.Now(), 0); !errors.Is(err, forward.ErrTimestamp) {
		t.Errorf("forward.Verify of an old timestamp: %v", err)
	}

	// Rotation: signed with the new and the old secret, it verifies with either.
	mu.Lock()
	key = other
	mu.Unlock()
	f, _ = forward.New(forward.Options{URL: tg.URL, Auth: forward.AuthHMAC, Secrets: []string{secret, other}})
	if err := f.Handle(context.Background(), tracedCtx()); err != nil {
		t.Errorf("rotation: a target on the old secret refused: %v", err)
	}
	if r, _, _ := tg.last(); len(strings.Fields(r.Header.Get("webhook-signature"))) != 2 {
		t.Errorf("rotation: signatures %q, want two", r.Header.Get("webhook-signature"))
	}
}

// forwardingDoc is the user's page on the forward handler, which shows the
// verifiers.
var forwardingDoc = filepath.Join("..", "..", "docs", "forwarding.md")

// docRecipe returns the docs' shell verification recipe: the lines of the
// sh block after "With the shell (curl + openssl)" up to the one that sends
// a test request.
func docRecipe(t *testing.T) string {
	b, err := os.ReadFile(forwardingDoc)
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(b), "With the shell (curl + openssl)")
	_, block, ok2 := strings.Cut(after, "```sh\n")
	recipe, _, ok3 := strings.Cut(block, "# and to send a signed test request")
	if !ok || !ok2 || !ok3 {
		t.Fatalf("the curl + openssl recipe of %s is not where this test looks for it", forwardingDoc)
	}
	return recipe
}

// The docs' curl + openssl recipe, run as written, accepts the
// forwarder's signature, and refuses a wrong secret and an old timestamp.
func TestOpenSSLRecipeVerifiesTheForwardersSignature(t *testing.T) {
	if _, err := exec.LookPath("openssl"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("openssl is not installed: .ci/run installs it under CI")
		}
		t.Skip("openssl is not installed")
	}
	recipe := docRecipe(t)
	secret := forward.NewSecret()
	tg := newTarget(t, func(*http.Request, []byte) error { return nil })
	run := func(secret string, at time.Time) string {
		f, _ := forward.New(forward.Options{URL: tg.URL, Auth: forward.AuthHMAC, Secrets: []string{secret},
			Now: func() time.Time { return at }})
		if err := f.Handle(context.Background(), tracedCtx()); err != nil {
			t.Fatal(err)
		}
		r, body, _ := tg.last()
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "body"), body, 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("sh", "-c", recipe)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "ID="+r.Header.Get("webhook-id"), "TS="+r.Header.Get("webhook-timestamp"),
			"SIG="+r.Header.Get("webhook-signature"))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		return strings.TrimSpace(string(out))
	}
	t.Setenv("SECRET", secret)
	if out := run(secret, time.Now()); out != "signature ok" {
		t.Errorf("the recipe on a good request: %q, want signature ok", out)
	}
	if out := run(forward.NewSecret(), time.Now()); out != "refused" {
		t.Errorf("the recipe on a foreign secret's signature: %q, want refused", out)
	}
	if out := run(secret, time.Now().Add(-10*time.Minute)); out != "signature ok\nrefused: timestamp" {
		t.Errorf("the recipe on an old timestamp: %q, want the timestamp refused", out)
	}
}

func TestSecretsAndModesAreChecked(t *testing.T) {
	for _, o := range []forward.Options{
		{URL: "https://x", Auth: forward.AuthHMAC},
		{URL: "https://x", Auth: forward.AuthHMAC, Secrets: []string{"whsec_c2hvcnQ="}},
		{URL: "https://x", Auth: forward.AuthHMAC, Secrets: []string{"not base64!"}},
		{URL: "http://x", Secrets: []string{forward.NewSecret()}},
		{URL: "http://x", Auth: "basic"},
	} {
		if _, err := forward.New(o); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
	if tp := forward.Traceparent(&event.Event{TraceID: "trace-1"}); tp != "" {
		t.Errorf("a trace id that is not W3C made traceparent %q", tp)
	}
	tp := forward.Traceparent(&event.Event{TraceID: "4BF92F3577B34DA6A3CE929D0E0E4736"})
	if len(tp) != 55 || !strings.HasPrefix(tp, "00-4bf92f3577b34da6a3ce929d0e0e4736-") || !strings.HasSuffix(tp, "-01") || tp[36:52] == "0000000000000000" {
		t.Errorf("traceparent without a span id: %q", tp)
	}
}

// fakeGoogle is a local stand-in for Google's OAuth token endpoint: it
// checks the JWT assertion a service account key signs (its target_audience)
// and answers a Google-style ID token signed with its own key, which the
// target verifies.
type fakeGoogle struct {
	*httptest.Server
	key *rsa.PrivateKey
}

func newFakeGoogle(t *testing.T, saKey *rsa.PrivateKey) *fakeGoogle {
	g := &fakeGoogle{}
	g.key, _ = rsa.GenerateKey(rand.Reader, 2048)
	g.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = r.ParseForm()
		claims, err := verifyJWT(r.PostForm.Get("assertion"), &saKey.PublicKey)
		if err != nil || r.PostForm.Get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer" {
			http.Error(w, `{"error":"invalid_grant"}`, http.StatusBadRequest)
			return
		}
		now := time.Now().Unix()
		tok := signJWT(g.key, map[string]any{"iss": "https://accounts.google.com", "aud": claims["target_audience"],
			"email": claims["iss"], "sub": "1234", "iat": now, "exp": now + 3600})
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"id_token": tok, "expires_in": 3600, "token_type": "Bearer"})
	}))
	t.Cleanup(g.Close)
	return g
}

func signJWT(key *rsa.PrivateKey, claims map[string]any) string {
	enc := func(v any) string { b, _ := json.Marshal(v); return base64.RawURLEncoding.EncodeToString(b) }
	head := enc(map[string]string{"alg": "RS256", "typ": "JWT"}) + "." + enc(claims)
	sum := sha256.Sum256([]byte(head))
	sig, _ := rsa.SignPKCS1v15(rand.Reader, key, crypto.SHA256, sum[:])
	return head + "." + base64.RawURLEncoding.EncodeToString(sig)
}

func verifyJWT(tok string, pub *rsa.PublicKey) (map[string]any, error) {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return nil, errors.New("not a JWT")
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	if err := rsa.VerifyPKCS1v15(pub, crypto.SHA256, sum[:], sig); err != nil {
		return nil, err
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return nil, err
	}
	var claims map[string]any
	return claims, json.Unmarshal(b, &claims)
}

// With FORWARD_AUTH=google the forwarder gets an ID token for the target's
// audience through idtoken.NewTokenSource and Application Default
// Credentials (here a service account key whose token endpoint is a local
// fake of Google's), and the target, checking the token's signature and
// audience, accepts it; a token for another audience is refused.
func TestGoogleIDTokenForTheTargetsAudience(t *testing.T) {
	saKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	google := newFakeGoogle(t, saKey)
	der, _ := x509.MarshalPKCS8PrivateKey(saKey)
	sa, _ := json.Marshal(map[string]string{"type": "service_account", "project_id": "p", "private_key_id": "k1",
		"private_key":  string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})),
		"client_email": "consume-audit@p.iam.gserviceaccount.com", "client_id": "1", "token_uri": google.URL + "/token"})
	path := filepath.Join(t.TempDir(), "sa.json")
	if err := os.WriteFile(path, sa, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", path)

	var audience string
	tg := newTarget(t, func(r *http.Request, _ []byte) error {
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok {
			return errors.New("no bearer token")
		}
		claims, err := verifyJWT(tok, &google.key.PublicKey)
		if err != nil {
			return err
		}
		if claims["aud"] != audience || claims["email"] != "consume-audit@p.iam.gserviceaccount.com" {
			return errors.New("wrong audience or caller")
		}
		return nil
	})
	audience = tg.URL
	f, err := forward.New(forward.Options{URL: tg.URL, Auth: forward.AuthGoogle})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Handle(context.Background(), tracedCtx()); err != nil {
		t.Fatalf("ID token for the target's URL: %v", err)
	}
	if r, _, _ := tg.last(); r.Header.Get("traceparent") == "" {
		t.Error("no traceparent")
	}
	u, _ := url.Parse(tg.URL)
	f, err = forward.New(forward.Options{URL: tg.URL, Auth: forward.AuthGoogle, Audience: "https://" + u.Host + ".example"})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Handle(context.Background(), tracedCtx()); err == nil {
		t.Error("a token for another audience was accepted")
	}
}
