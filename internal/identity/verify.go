package identity

import (
	"context"
	"crypto"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// GoogleKeysURL is where Google publishes the keys that sign its ID tokens
// (a JSON Web Key Set).
const GoogleKeysURL = "https://www.googleapis.com/oauth2/v3/certs"

// Defaults of VerifierOptions.
const (
	// DefaultKeysTTL is how long fetched keys are used when the answer has
	// no Cache-Control max-age.
	DefaultKeysTTL = time.Hour
	// minRefetch is the least time between two fetches caused by a key id
	// the cached set does not hold (a rotation, or a forged kid).
	minRefetch = 30 * time.Second
	// maxKeysBody bounds the key set's answer.
	maxKeysBody = 1 << 20
)

// VerifierOptions configure a Verifier. Audiences is required.
type VerifierOptions struct {
	// Audiences are the audiences a token may have (the service's URL, a
	// custom audience); a token for any other is refused. Required: a
	// Google ID token minted for any other service must not pass.
	Audiences []string
	// KeysURL is the JSON Web Key Set (GoogleKeysURL when empty); tests
	// serve their own.
	KeysURL string
	// HTTPClient fetches the keys (a client with a 10 s timeout when nil).
	HTTPClient *http.Client
	// Now is the clock (time.Now when nil); Leeway the allowed skew on exp
	// and iat (DefaultLeeway when zero).
	Now    func() time.Time
	Leeway time.Duration
}

// Verifier verifies Google ID tokens that still carry their signature:
// RS256 with one of Google's keys, a Google issuer, not expired, and an
// audience among the configured ones. Its keys are fetched when first
// needed, kept for the answer's Cache-Control max-age, and fetched again
// (at most every 30 s) when a token names a key id they do not hold. It is
// safe for concurrent use.
type Verifier struct {
	o VerifierOptions

	mu      sync.Mutex
	keys    map[string]*rsa.PublicKey
	expires time.Time
	fetched time.Time
}

// NewVerifier returns a Verifier, or an error when no audience is given.
func NewVerifier(o VerifierOptions) (*Verifier, error) {
	var auds []string
	for _, a := range o.Audiences {
		if a = strings.TrimSpace(a); a != "" {
			auds = append(auds, a)
		}
	}
	if len(auds) == 0 {
		return nil, errors.New("identity: a verifier needs at least one audience: without one, any Google ID token, minted for any service, would pass")
	}
	o.Audiences = auds
	if o.KeysURL == "" {
		o.KeysURL = GoogleKeysURL
	}
	if o.HTTPClient == nil {
		o.HTTPClient = &http.Client{Timeout: 10 * time.Second}
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Leeway <= 0 {
		o.Leeway = DefaultLeeway
	}
	return &Verifier{o: o}, nil
}

// Audiences returns the audiences the verifier accepts.
func (v *Verifier) Audiences() []string { return v.o.Audiences }

// Verify checks a token's signature and claims and returns its claims. A
// refused token's error matches ErrInvalidToken and says why; keys that
// cannot be fetched are another error.
func (v *Verifier) Verify(ctx context.Context, tok string) (Claims, error) {
	h, claims, sig, err := split(tok)
	if err != nil {
		return Claims{}, err
	}
	if sig == nil {
		return Claims{}, fmt.Errorf("%w: its signature was removed (%s): only Cloud Run's IAM, which verified it, may pass such a token on", ErrInvalidToken, StrippedSignature)
	}
	if h.Alg != "RS256" {
		return Claims{}, fmt.Errorf("%w: it is signed with %q, Google signs ID tokens with RS256", ErrInvalidToken, h.Alg)
	}
	key, err := v.key(ctx, h.Kid)
	if err != nil {
		return Claims{}, err
	}
	signed := tok[:strings.LastIndexByte(tok, '.')]
	sum := sha256.Sum256([]byte(signed))
	if err := rsa.VerifyPKCS1v15(key, crypto.SHA256, sum[:], sig); err != nil {
		return Claims{}, fmt.Errorf("%w: its signature is not Google's", ErrInvalidToken)
	}
	if err := claims.check(v.o.Now(), v.o.Leeway, v.o.Audiences); err != nil {
		return Claims{}, err
	}
	return claims, nil
}

// Caller verifies r's bearer token (X-Serverless-Authorization first, then
// Authorization) and names its holder.
func (v *Verifier) Caller(r *http.Request) (Caller, error) {
	tok := Bearer(r)
	if tok == "" {
		return Caller{}, ErrNoToken
	}
	claims, err := v.Verify(r.Context(), tok)
	if err != nil {
		return Caller{}, err
	}
	return claims.Caller()
}

// key returns the public key of a key id, fetching the key set when it is
// stale or does not hold the id.
func (v *Verifier) key(ctx context.Context, kid string) (*rsa.PublicKey, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	now := v.o.Now()
	if k, ok := v.keys[kid]; ok && now.Before(v.expires) {
		return k, nil
	}
	if v.keys == nil || !now.Before(v.expires) || now.Sub(v.fetched) >= minRefetch {
		if err := v.fetch(ctx, now); err != nil {
			if k, ok := v.keys[kid]; ok {
				return k, nil // a failed refresh keeps the keys it had
			}
			return nil, err
		}
	}
	if k, ok := v.keys[kid]; ok {
		return k, nil
	}
	return nil, fmt.Errorf("%w: no Google key has its key id (kid %q)", ErrInvalidToken, kid)
}

// jwks is a JSON Web Key Set.
type jwks struct {
	Keys []struct {
		Kty string `json:"kty"`
		Kid string `json:"kid"`
		N   string `json:"n"`
		E   string `json:"e"`
	} `json:"keys"`
}

func (v *Verifier) fetch(ctx context.Context, now time.Time) error {
	v.fetched = now
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, v.o.KeysURL, nil)
	if err != nil {
		return fmt.Errorf("identity: the ID token keys: %w", err)
	}
	resp, err := v.o.HTTPClient.Do(req)
	if err != nil {
		return fmt.Errorf("identity: the ID token keys (%s): %w", v.o.KeysURL, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("identity: the ID token keys (%s): HTTP %d", v.o.KeysURL, resp.StatusCode)
	}
	var set jwks
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxKeysBody)).Decode(&set); err != nil {
		return fmt.Errorf("identity: the ID token keys (%s): %w", v.o.KeysURL, err)
	}
	keys := map[string]*rsa.PublicKey{}
	for _, k := range set.Keys {
		if k.Kty != "RSA" {
			continue
		}
		n, err1 := base64.RawURLEncoding.DecodeString(k.N)
		e, err2 := base64.RawURLEncoding.DecodeString(k.E)
		if err1 != nil || err2 != nil || len(e) == 0 || len(e) > 4 {
			continue
		}
		keys[k.Kid] = &rsa.PublicKey{N: new(big.Int).SetBytes(n), E: int(new(big.Int).SetBytes(e).Int64())}
	}
	if len(keys) == 0 {
		return fmt.Errorf("identity: the ID token keys (%s): no RSA key", v.o.KeysURL)
	}
	v.keys, v.expires = keys, now.Add(maxAge(resp.Header.Get("Cache-Control")))
	return nil
}

// maxAge is a Cache-Control header's max-age, DefaultKeysTTL when it has
// none.
func maxAge(cc string) time.Duration {
	for _, d := range strings.Split(cc, ",") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(d), "max-age="); ok {
			if s, err := strconv.Atoi(v); err == nil && s > 0 {
				return time.Duration(s) * time.Second
			}
		}
	}
	return DefaultKeysTTL
}
