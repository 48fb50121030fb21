// Package identity names the caller of a request that Cloud Run's IAM
// admitted.
//
// A Cloud Run service that requires authentication verifies the caller's
// Google-signed ID token itself and hands the request on with the token's
// signature replaced by SIGNATURE_REMOVED_BY_GOOGLE
// (https://cloud.google.com/run/docs/authenticating/service-to-service), in
// Authorization or, when the caller used it, X-Serverless-Authorization. The
// service cannot verify that token again; it reads the claims, which the
// platform checked. So FromCloudRun is only to be trusted on a service whose
// invokers IAM restricts (never allUsers).
package identity

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
)

// Caller is who made a request.
type Caller struct {
	// Email is the token's email claim, lower-cased ("" when it has none).
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

// googleIssuers are the issuers of Google ID tokens.
var googleIssuers = map[string]bool{"https://accounts.google.com": true, "accounts.google.com": true}

// FromCloudRun reads the caller from the ID token Cloud Run verified
// (X-Serverless-Authorization first, then Authorization). It returns
// ErrNoToken when there is none, and an error saying what is wrong with a
// token that is not a Google ID token's shape.
func FromCloudRun(r *http.Request) (Caller, error) {
	tok := bearer(r.Header.Get("X-Serverless-Authorization"))
	if tok == "" {
		tok = bearer(r.Header.Get("Authorization"))
	}
	if tok == "" {
		return Caller{}, ErrNoToken
	}
	parts := strings.Split(tok, ".")
	if len(parts) != 3 || parts[2] == "" {
		return Caller{}, errors.New("the bearer token is not a JWT (header.claims.signature)")
	}
	var claims struct {
		Iss   string `json:"iss"`
		Email string `json:"email"`
		Sub   string `json:"sub"`
	}
	b, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil || json.Unmarshal(b, &claims) != nil {
		return Caller{}, errors.New("the bearer token's claims are not base64url JSON")
	}
	if !googleIssuers[claims.Iss] {
		return Caller{}, errors.New("the ID token was not issued by Google (iss)")
	}
	c := Caller{Email: strings.ToLower(claims.Email), Subject: claims.Sub}
	if c.Name() == "" {
		return Caller{}, errors.New("the ID token names no caller (neither email nor sub)")
	}
	return c, nil
}

func bearer(h string) string {
	scheme, tok, ok := strings.Cut(strings.TrimSpace(h), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(tok)
}
