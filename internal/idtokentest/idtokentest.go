// Package idtokentest mints Google-shaped ID tokens for tests: signed
// RS256 with a locally generated key whose JSON Web Key Set an httptest
// server publishes (identity.VerifierOptions.KeysURL), or with the
// signature Cloud Run's IAM replaces (SIGNATURE_REMOVED_BY_GOOGLE). No test
// needs Google's network.
package idtokentest

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"math/big"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// Issuer signs tokens and serves its keys.
type Issuer struct {
	key *rsa.PrivateKey
	kid string
	srv *httptest.Server
	// Fetches counts the requests for the key set.
	Fetches atomic.Int64
}

// New returns an issuer whose key set is served until the test ends.
func New(t testing.TB) *Issuer {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	is := &Issuer{key: key, kid: "test-key-1"}
	is.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		is.Fetches.Add(1)
		e := big.NewInt(int64(key.E)).Bytes()
		w.Header().Set("Cache-Control", "public, max-age=3600")
		_ = json.NewEncoder(w).Encode(map[string]any{"keys": []map[string]string{{
			"kty": "RSA", "alg": "RS256", "use": "sig", "kid": is.kid,
			"n": base64.RawURLEncoding.EncodeToString(key.N.Bytes()), "e": base64.RawURLEncoding.EncodeToString(e),
		}}})
	}))
	t.Cleanup(is.srv.Close)
	return is
}

// KeysURL is the key set's URL.
func (is *Issuer) KeysURL() string { return is.srv.URL }

// Claims returns a valid token's claims for email and audience: Google's
// issuer, a verified email, issued now, expiring in an hour.
func Claims(email, audience string) map[string]any {
	now := time.Now().Unix()
	return map[string]any{"iss": "https://accounts.google.com", "aud": audience, "email": email, "email_verified": true,
		"sub": "sub-" + email, "iat": now, "exp": now + 3600}
}

// Sign returns a token with claims, signed by the issuer's key.
func (is *Issuer) Sign(claims map[string]any) string {
	head := encode(map[string]string{"alg": "RS256", "typ": "JWT", "kid": is.kid})
	signed := head + "." + encode(claims)
	sum := sha256.Sum256([]byte(signed))
	sig, err := rsa.SignPKCS1v15(rand.Reader, is.key, crypto.SHA256, sum[:])
	if err != nil {
		panic(err)
	}
	return signed + "." + base64.RawURLEncoding.EncodeToString(sig)
}

// Stripped returns a token with claims as Cloud Run's IAM hands it on: its
// signature replaced by SIGNATURE_REMOVED_BY_GOOGLE. Anyone can write one.
func Stripped(claims map[string]any) string {
	return encode(map[string]string{"alg": "RS256", "typ": "JWT", "kid": "test-key-1"}) + "." + encode(claims) + ".SIGNATURE_REMOVED_BY_GOOGLE"
}

func encode(v any) string {
	b, _ := json.Marshal(v)
	return base64.RawURLEncoding.EncodeToString(b)
}
