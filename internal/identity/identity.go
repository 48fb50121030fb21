// Package identity names the caller of a request from its Google ID token,
// in one of two ways.
//
// Behind Cloud Run IAM ([CloudRun]): a Cloud Run service that requires
// authentication verifies the caller's Google-signed ID token itself and
// hands the request on with the token's signature replaced by
// SIGNATURE_REMOVED_BY_GOOGLE
// (https://cloud.google.com/run/docs/authenticating/service-to-service), in
// Authorization or, when the caller used it, X-Serverless-Authorization.
// The service cannot verify that token again; it reads the claims the
// platform checked, and checks again what it can: the issuer, the expiry
// and the audience. Anyone can write such a token, so CloudRun is only to
// be trusted on a service whose invokers IAM restricts (never allUsers),
// and the functions refuse to start it anywhere but on Cloud Run.
//
// Anywhere else ([Verifier]): the token still carries its signature, which
// is checked against Google's published keys (a JSON Web Key Set), with the
// issuer, the expiry and an audience that must be configured: a Google ID
// token minted for any other service is refused.
package identity

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
)

// Caller is who made a request.
type Caller struct {
	// Email is the token's email claim, lower-cased, when the token says
	// it is verified ("" otherwise).
	Email string
	// Subject is the token's sub claim.
	Subject string
}

// Name is the caller's email, else its subject.
func (c Caller) Name() string {
	if c.Email != "" {
		return c.Email
	}
	return c.Subject
}

// Service is the name a service account's email gives its service: the
// account id before the @ (order-service@p.iam.gserviceaccount.com is
// order-service); a user's email or a subject is returned whole.
func (c Caller) Service() string {
	if id, domain, ok := strings.Cut(c.Email, "@"); ok && strings.HasSuffix(domain, ".gserviceaccount.com") {
		return id
	}
	return c.Name()
}

// ErrNoToken: the request carries no bearer token.
var ErrNoToken = errors.New("no Authorization: Bearer <Google ID token> header")

// ErrInvalidToken is matched (errors.Is) by every refusal of a token that
// was there: malformed, not Google's, expired, for another audience, or
// (Verifier) not signed by Google.
var ErrInvalidToken = errors.New("invalid ID token")

// StrippedSignature is what Cloud Run puts where a verified token's
// signature was.
const StrippedSignature = "SIGNATURE_REMOVED_BY_GOOGLE"

// GoogleIssuers are the issuers of Google ID tokens.
var GoogleIssuers = []string{"https://accounts.google.com", "accounts.google.com"}

// DefaultLeeway is the clock skew allowed on a token's exp and iat.
const DefaultLeeway = time.Minute

// Claims are the claims of a Google ID token that identify its holder.
type Claims struct {
	Issuer        string   `json:"iss"`
	Subject       string   `json:"sub"`
	Email         string   `json:"email"`
	EmailVerified bool     `json:"email_verified"`
	Audience      Audience `json:"aud"`
	Expiry        int64    `json:"exp"`
	IssuedAt      int64    `json:"iat"`
}

// Audience is a token's aud claim: one string or a list.
type Audience []string

// UnmarshalJSON reads a string or an array of strings.
func (a *Audience) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*a = Audience{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return errors.New("aud is neither a string nor a list of strings")
	}
	*a = many
	return nil
}

// Caller names the holder: the email when the token says it is verified,
// else the subject.
func (c Claims) Caller() (Caller, error) {
	out := Caller{Subject: c.Subject}
	if c.EmailVerified {
		out.Email = strings.ToLower(c.Email)
	}
	if out.Name() == "" {
		return Caller{}, fmt.Errorf("%w: it names no caller (neither a verified email nor sub)", ErrInvalidToken)
	}
	return out, nil
}

// check checks the claims every mode checks: a Google issuer, not expired
// (nor issued in the future), and, when audiences are given, an audience
// among them.
func (c Claims) check(now time.Time, leeway time.Duration, audiences []string) error {
	if !slices.Contains(GoogleIssuers, c.Issuer) {
		return fmt.Errorf("%w: it was not issued by Google (iss)", ErrInvalidToken)
	}
	if c.Expiry == 0 || now.After(time.Unix(c.Expiry, 0).Add(leeway)) {
		return fmt.Errorf("%w: it has expired (exp)", ErrInvalidToken)
	}
	if c.IssuedAt != 0 && time.Unix(c.IssuedAt, 0).After(now.Add(leeway)) {
		return fmt.Errorf("%w: it was issued in the future (iat)", ErrInvalidToken)
	}
	if len(audiences) > 0 && !slices.ContainsFunc(c.Audience, func(a string) bool { return slices.Contains(audiences, a) }) {
		return fmt.Errorf("%w: its audience (aud) is not one of %s", ErrInvalidToken, strings.Join(audiences, ", "))
	}
	return nil
}

// CloudRun reads callers behind Cloud Run IAM (see the package
// documentation): the claims of the token the platform verified, checked
// again for issuer, expiry and audience.
type CloudRun struct {
	// Audiences, when set, are the audiences a token may have (the
	// service's URLs, and for users' gcloud tokens gcloud's client id);
	// empty checks none.
	Audiences []string
	// Now is the clock (time.Now when nil); Leeway the allowed skew
	// (DefaultLeeway when zero).
	Now    func() time.Time
	Leeway time.Duration
}

// Caller reads the caller of r from the token Cloud Run verified
// (X-Serverless-Authorization first, then Authorization). It returns
// ErrNoToken when there is none, and an error matching ErrInvalidToken that
// says what is wrong with one that is there.
func (c CloudRun) Caller(r *http.Request) (Caller, error) {
	tok := Bearer(r)
	if tok == "" {
		return Caller{}, ErrNoToken
	}
	claims, err := c.Claims(tok)
	if err != nil {
		return Caller{}, err
	}
	return claims.Caller()
}

// Claims reads and checks the claims of a token Cloud Run verified.
func (c CloudRun) Claims(tok string) (Claims, error) {
	_, claims, _, err := split(tok)
	if err != nil {
		return Claims{}, err
	}
	now, leeway := time.Now, c.Leeway
	if c.Now != nil {
		now = c.Now
	}
	if leeway <= 0 {
		leeway = DefaultLeeway
	}
	if err := claims.check(now(), leeway, c.Audiences); err != nil {
		return Claims{}, err
	}
	return claims, nil
}

// FromCloudRun is CloudRun{}.Caller: the caller Cloud Run verified, with
// its issuer and expiry checked and no audience.
func FromCloudRun(r *http.Request) (Caller, error) { return CloudRun{}.Caller(r) }

// Stripped reports whether a token's signature is Cloud Run's
// StrippedSignature (so it cannot be verified).
func Stripped(tok string) bool { return strings.HasSuffix(tok, "."+StrippedSignature) }

// Bearer returns the bearer token of r: X-Serverless-Authorization's, else
// Authorization's ("" when neither holds one).
func Bearer(r *http.Request) string {
	if tok := bearer(r.Header.Get("X-Serverless-Authorization")); tok != "" {
		return tok
	}
	return bearer(r.Header.Get("Authorization"))
}

func bearer(h string) string {
	scheme, tok, ok := strings.Cut(strings.TrimSpace(h), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(tok)
}

// header is a JWT's header.
type header struct {
	Alg string `json:"alg"`
	Kid string `json:"kid"`
}

// split decodes a JWT's header and claims and its signature's bytes (nil
// when it is StrippedSignature).
func split(tok string) (header, Claims, []byte, error) {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 || parts[2] == "" {
		return header{}, Claims{}, nil, fmt.Errorf("%w: the bearer token is not a JWT (header.claims.signature)", ErrInvalidToken)
	}
	var h header
	if err := decodeSegment(parts[0], &h); err != nil || h.Alg == "" {
		return header{}, Claims{}, nil, fmt.Errorf("%w: the bearer token's header is not base64url JSON with an alg", ErrInvalidToken)
	}
	var c Claims
	if err := decodeSegment(parts[1], &c); err != nil {
		return header{}, Claims{}, nil, fmt.Errorf("%w: the bearer token's claims are not base64url JSON", ErrInvalidToken)
	}
	if parts[2] == StrippedSignature {
		return h, c, nil, nil
	}
	sig, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[2], "="))
	if err != nil {
		return header{}, Claims{}, nil, fmt.Errorf("%w: the bearer token's signature is not base64url", ErrInvalidToken)
	}
	return h, c, sig, nil
}

func decodeSegment(s string, v any) error {
	b, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(s, "="))
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}
