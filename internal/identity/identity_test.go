package identity_test

import (
	"context"
	"errors"
	"maps"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/identity"
	"github.com/relaybus/relaybus/internal/idtokentest"
)

const aud = "https://relaybus-dlqreplay-123.europe-west1.run.app"

// with returns claims with changes applied (a nil value deletes).
func with(claims map[string]any, changes map[string]any) map[string]any {
	out := maps.Clone(claims)
	for k, v := range changes {
		if v == nil {
			delete(out, k)
		} else {
			out[k] = v
		}
	}
	return out
}

func request(headers map[string]string) *http.Request {
	r, _ := http.NewRequest("POST", "http://x/", nil)
	for k, v := range headers {
		r.Header.Set(k, v)
	}
	return r
}

// CloudRun reads the claims the platform verified and checks again what
// it can: issuer, expiry and audience. An expired token, or one minted for
// another service, is refused even with the signature stripped.
func TestCloudRun(t *testing.T) {
	sa := "Order-Service@p.iam.gserviceaccount.com"
	good := idtokentest.Claims(sa, aud)
	hour := time.Now().Add(-time.Hour).Unix()
	for _, c := range []struct {
		name    string
		headers map[string]string
		email   string
		service string
		err     string
		noToken bool
	}{
		{name: "none", noToken: true, err: "no Authorization"},
		{name: "basic", headers: map[string]string{"Authorization": "Basic eDp5"}, noToken: true, err: "no Authorization"},
		{name: "not a JWT", headers: map[string]string{"Authorization": "Bearer abc"}, err: "not a JWT"},
		{name: "not Google's", headers: map[string]string{"Authorization": "Bearer " + idtokentest.Stripped(with(good, map[string]any{"iss": "https://evil.example"}))}, err: "iss"},
		{name: "nobody", headers: map[string]string{"Authorization": "Bearer " + idtokentest.Stripped(with(good, map[string]any{"email": nil, "sub": nil}))}, err: "names no caller"},
		{name: "expired a day ago", headers: map[string]string{"Authorization": "Bearer " + idtokentest.Stripped(with(good, map[string]any{"exp": hour - 23*3600, "iat": hour - 24*3600}))}, err: "expired"},
		{name: "no expiry", headers: map[string]string{"Authorization": "Bearer " + idtokentest.Stripped(with(good, map[string]any{"exp": nil}))}, err: "expired"},
		{name: "issued in the future", headers: map[string]string{"Authorization": "Bearer " + idtokentest.Stripped(with(good, map[string]any{"iat": time.Now().Add(time.Hour).Unix()}))}, err: "future"},
		{name: "another service's audience", headers: map[string]string{"Authorization": "Bearer " + idtokentest.Stripped(with(good, map[string]any{"aud": "https://other.run.app"}))}, err: "audience"},
		{name: "an audience in a list", headers: map[string]string{"Authorization": "Bearer " + idtokentest.Stripped(with(good, map[string]any{"aud": []string{"x", aud}}))},
			email: "order-service@p.iam.gserviceaccount.com", service: "order-service"},
		{name: "a service account", headers: map[string]string{"Authorization": "Bearer " + idtokentest.Stripped(good)},
			email: "order-service@p.iam.gserviceaccount.com", service: "order-service"},
		{name: "an unverified email names the subject", headers: map[string]string{"Authorization": "Bearer " + idtokentest.Stripped(with(good, map[string]any{"email_verified": false}))},
			email: "", service: "sub-" + sa},
		{name: "a user", headers: map[string]string{"Authorization": "Bearer " + idtokentest.Stripped(idtokentest.Claims("alice@example.com", aud))},
			email: "alice@example.com", service: "alice@example.com"},
		{name: "X-Serverless-Authorization first", headers: map[string]string{"Authorization": "Basic eDp5",
			"X-Serverless-Authorization": "Bearer " + idtokentest.Stripped(idtokentest.Claims("x@p.iam.gserviceaccount.com", aud))},
			email: "x@p.iam.gserviceaccount.com", service: "x"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := identity.CloudRun{Audiences: []string{aud}}.Caller(request(c.headers))
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want one saying %q", err, c.err)
				}
				if errors.Is(err, identity.ErrNoToken) != c.noToken || (!c.noToken && !errors.Is(err, identity.ErrInvalidToken)) {
					t.Fatalf("err %v: no token %v, want %v", err, errors.Is(err, identity.ErrNoToken), c.noToken)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Email != c.email || got.Service() != c.service {
				t.Errorf("caller %+v (service %s), want %q / %q", got, got.Service(), c.email, c.service)
			}
		})
	}
	// Without audiences, the audience is not checked; expiry still is.
	if _, err := (identity.CloudRun{}).Caller(request(map[string]string{"Authorization": "Bearer " + idtokentest.Stripped(with(good, map[string]any{"aud": "anything"}))})); err != nil {
		t.Errorf("no audiences configured: %v", err)
	}
}

// The Verifier checks the signature against the keys a JSON Web Key Set
// publishes (here a local key served by httptest), the issuer, the expiry
// and an audience that must be configured.
func TestVerifier(t *testing.T) {
	is := idtokentest.New(t)
	if _, err := identity.NewVerifier(identity.VerifierOptions{KeysURL: is.KeysURL()}); err == nil {
		t.Fatal("a verifier without an audience was built: any Google ID token would pass")
	}
	v, err := identity.NewVerifier(identity.VerifierOptions{Audiences: []string{aud}, KeysURL: is.KeysURL()})
	if err != nil {
		t.Fatal(err)
	}
	good := idtokentest.Claims("alice@example.com", aud)
	other := idtokentest.New(t) // a key Google does not publish
	forged := is.Sign(good)
	forged = forged[:strings.LastIndexByte(forged, '.')+1] + other.Sign(good)[strings.LastIndexByte(other.Sign(good), '.')+1:]
	for _, c := range []struct {
		name, tok, err string
	}{
		{"signed", is.Sign(good), ""},
		{"stripped signature", idtokentest.Stripped(good), "signature was removed"},
		{"another key's signature", forged, "not Google's"},
		{"claims changed after signing", func() string {
			s := is.Sign(good)
			parts := strings.Split(s, ".")
			parts[1] = strings.Split(idtokentest.Stripped(with(good, map[string]any{"email": "mallory@example.com"})), ".")[1]
			return strings.Join(parts, ".")
		}(), "not Google's"},
		{"expired", is.Sign(with(good, map[string]any{"exp": time.Now().Add(-time.Hour).Unix()})), "expired"},
		{"another audience", is.Sign(with(good, map[string]any{"aud": "https://other.run.app"})), "audience"},
		{"not Google's issuer", is.Sign(with(good, map[string]any{"iss": "https://evil.example"})), "iss"},
		{"alg none", strings.Replace(is.Sign(good), strings.Split(is.Sign(good), ".")[0], "eyJhbGciOiJub25lIn0", 1), "RS256"},
	} {
		t.Run(c.name, func(t *testing.T) {
			claims, err := v.Verify(context.Background(), c.tok)
			if c.err == "" {
				if err != nil || claims.Email != "alice@example.com" {
					t.Fatalf("%+v, %v", claims, err)
				}
				return
			}
			if !errors.Is(err, identity.ErrInvalidToken) || !strings.Contains(err.Error(), c.err) {
				t.Fatalf("err %v, want ErrInvalidToken saying %q", err, c.err)
			}
		})
	}
	if n := is.Fetches.Load(); n != 1 {
		t.Errorf("the key set was fetched %d times, want 1 (kept for its max-age)", n)
	}
}
