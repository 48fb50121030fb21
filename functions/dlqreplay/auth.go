package dlqreplay

import (
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"google.golang.org/api/idtoken"
)

// Auth modes (DLQREPLAY_AUTH).
const (
	// AuthCloudRun trusts Cloud Run's IAM: the platform verified the
	// caller's Google ID token before the request arrived and hands it on
	// with its signature replaced by SIGNATURE_REMOVED_BY_GOOGLE
	// (https://cloud.google.com/run/docs/authenticating/service-to-service),
	// so the token cannot be verified again; the caller is read from its
	// claims. Use it only on a service whose invokers IAM restricts (never
	// allUsers).
	AuthCloudRun = "cloudrun"
	// AuthIAM verifies a Google ID token itself (a signed token: behind a
	// load balancer or proxy that keeps the signature).
	AuthIAM = "iam"
	// AuthToken compares the header TokenHeader with a static token
	// (DLQREPLAY_TOKEN, from Secret Manager). The token travels in its own
	// header because Cloud Run's IAM needs Authorization for the ID token.
	AuthToken = "token"
	// AuthNone trusts every caller (a local stack).
	AuthNone = "none"
	// AuthPushOIDC names, in a Principal's Method, the push subscription
	// OIDC token that authenticates POST /deadletters:archive under
	// AuthToken (see pushIdentity); it is not a DLQREPLAY_AUTH mode.
	AuthPushOIDC = "push-oidc"
)

// TokenHeader carries the static token of AuthToken.
const TokenHeader = "X-Relaybus-Token"

// serverlessAuthHeader is the header Cloud Run also accepts the ID token
// in (it then leaves Authorization to the application, and strips the
// signature of this one instead).
const serverlessAuthHeader = "X-Serverless-Authorization"

// strippedSignature is what Cloud Run puts where the token's signature was.
const strippedSignature = "SIGNATURE_REMOVED_BY_GOOGLE"

// Principal is an authenticated caller.
type Principal struct {
	// Name identifies the caller in logs and the audit log: the ID token's
	// email (its subject when it has none), "token" or "anonymous".
	Name string `json:"name"`
	// Method is the auth mode that accepted the caller.
	Method string `json:"method"`
}

// googleIssuers are the issuers of Google ID tokens.
var googleIssuers = map[string]bool{"https://accounts.google.com": true, "accounts.google.com": true}

// authenticate names the caller of r, or says why it cannot.
func (a *api) authenticate(r *http.Request) (Principal, error) {
	switch a.o.Auth {
	case AuthNone:
		return Principal{Name: "anonymous", Method: AuthNone}, nil
	case AuthToken:
		got := r.Header.Get(TokenHeader)
		if got == "" {
			return Principal{}, fmt.Errorf("the %s header is required", TokenHeader)
		}
		if subtle.ConstantTimeCompare([]byte(got), []byte(a.o.Token)) != 1 {
			return Principal{}, fmt.Errorf("the %s header does not hold DLQREPLAY_TOKEN", TokenHeader)
		}
		return Principal{Name: "token", Method: AuthToken}, nil
	}
	tok := bearer(r.Header.Get(serverlessAuthHeader))
	if tok == "" {
		tok = bearer(r.Header.Get("Authorization"))
	}
	if tok == "" {
		return Principal{}, errors.New("an Authorization: Bearer <Google ID token> header is required")
	}
	if a.o.Auth == AuthIAM {
		p, err := idtoken.Validate(r.Context(), tok, a.o.Audience)
		if err != nil {
			return Principal{}, errors.New("the ID token does not verify (expired, wrong audience or not signed by Google)")
		}
		return principalOf(p.Claims, AuthIAM)
	}
	claims, err := cloudRunClaims(tok)
	if err != nil {
		return Principal{}, err
	}
	if a.o.Audience != "" && !hasAudience(claims["aud"], a.o.Audience) {
		return Principal{}, fmt.Errorf("the ID token's audience is not %s", a.o.Audience)
	}
	return principalOf(claims, AuthCloudRun)
}

// pushIdentity authenticates POST /deadletters:archive under AuthToken.
// Pub/Sub push cannot add a header, so the DLQ monitors cannot send
// X-Relaybus-Token; they send what push can: the OIDC token of their push
// service account in Authorization
// (https://cloud.google.com/pubsub/docs/authenticate-push-subscriptions).
// Behind Cloud Run IAM the platform verified it and replaced its signature
// (SIGNATURE_REMOVED_BY_GOOGLE): its claims are read. A token that still
// has its signature did not pass through Cloud Run's check, so it is
// verified here (idtoken.Validate). Either way it must be issued by Google,
// for Audience when that is set, to a verified email; the route then
// admits only Archivers (which New requires in token mode).
func (a *api) pushIdentity(r *http.Request) (Principal, error) {
	tok := bearer(r.Header.Get(serverlessAuthHeader))
	if tok == "" {
		tok = bearer(r.Header.Get("Authorization"))
	}
	if tok == "" {
		return Principal{}, errors.New("POST /deadletters:archive takes the push subscription's OIDC token (Authorization: Bearer), not X-Relaybus-Token: Pub/Sub push cannot add headers")
	}
	var claims map[string]any
	if parts := strings.Split(tok, "."); len(parts) == 3 && parts[2] == strippedSignature {
		c, err := cloudRunClaims(tok)
		if err != nil {
			return Principal{}, err
		}
		claims = c
	} else {
		p, err := idtoken.Validate(r.Context(), tok, a.o.Audience)
		if err != nil {
			return Principal{}, errors.New("the push OIDC token does not verify (expired, wrong audience or not signed by Google)")
		}
		claims = p.Claims
	}
	if a.o.Audience != "" && !hasAudience(claims["aud"], a.o.Audience) {
		return Principal{}, fmt.Errorf("the push OIDC token's audience is not %s", a.o.Audience)
	}
	if v, ok := claims["email_verified"].(bool); !ok || !v {
		return Principal{}, errors.New("the push OIDC token has no verified email (a push subscription's service account has one)")
	}
	p, err := principalOf(claims, AuthPushOIDC)
	if err != nil {
		return Principal{}, err
	}
	return p, nil
}

// bearer returns the token of an "Authorization: Bearer <token>" value.
func bearer(h string) string {
	scheme, tok, ok := strings.Cut(strings.TrimSpace(h), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(tok)
}

// cloudRunClaims reads the claims of an ID token Cloud Run has verified:
// three dot-separated base64url parts whose signature Cloud Run replaced
// (SIGNATURE_REMOVED_BY_GOOGLE; a signature still in place is accepted
// too, since the platform checked it either way), issued by Google.
func cloudRunClaims(tok string) (map[string]any, error) {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 || parts[2] == "" {
		return nil, errors.New("the bearer token is not a JWT (header.claims.signature)")
	}
	var header struct {
		Alg string `json:"alg"`
	}
	if err := decodeSegment(parts[0], &header); err != nil || header.Alg == "" {
		return nil, errors.New("the bearer token's header is not base64url JSON with an alg")
	}
	claims := map[string]any{}
	if err := decodeSegment(parts[1], &claims); err != nil {
		return nil, errors.New("the bearer token's claims are not base64url JSON")
	}
	if iss, _ := claims["iss"].(string); !googleIssuers[iss] {
		return nil, errors.New("the ID token was not issued by Google (iss)")
	}
	return claims, nil
}

func decodeSegment(s string, v any) error {
	b, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(s, "="))
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// hasAudience reports whether an aud claim (a string or a list) holds want.
func hasAudience(aud any, want string) bool {
	switch v := aud.(type) {
	case string:
		return v == want
	case []any:
		for _, x := range v {
			if s, _ := x.(string); s == want {
				return true
			}
		}
	}
	return false
}

// principalOf names the caller of verified claims: its email, else its
// subject.
func principalOf(claims map[string]any, method string) (Principal, error) {
	if email, _ := claims["email"].(string); email != "" {
		return Principal{Name: strings.ToLower(email), Method: method}, nil
	}
	if sub, _ := claims["sub"].(string); sub != "" {
		return Principal{Name: sub, Method: method}, nil
	}
	return Principal{}, errors.New("the ID token names no caller (neither email nor sub)")
}

// principals is a parsed list of principals (DLQREPLAY_WRITERS,
// DLQREPLAY_ARCHIVERS).
type principals struct {
	all   bool
	names map[string]bool
}

// parsePrincipals reads a comma-separated list of principals: emails (an
// IAM member prefix user: or serviceAccount: is dropped), subjects, token,
// anonymous; empty or * is everyone authenticated. Groups and domains
// cannot be matched against a token and are refused.
func parsePrincipals(variable string, list []string) (principals, error) {
	p := principals{names: map[string]bool{}}
	for _, raw := range list {
		s := strings.TrimSpace(raw)
		switch {
		case s == "":
			continue
		case s == "*":
			p.all = true
			continue
		case strings.HasPrefix(s, "group:"), strings.HasPrefix(s, "domain:"), strings.Contains(s, " "):
			return principals{}, fmt.Errorf("%s: %q: list emails (user: or serviceAccount: prefixes are fine), subjects, token or anonymous; groups and domains cannot be checked against an ID token", variable, s)
		}
		if _, rest, ok := strings.Cut(s, ":"); ok && (strings.HasPrefix(s, "user:") || strings.HasPrefix(s, "serviceAccount:")) {
			s = rest
		}
		p.names[strings.ToLower(s)] = true
	}
	if len(p.names) == 0 {
		p.all = true
	}
	return p, nil
}

func (p principals) allows(who Principal) bool {
	return p.all || p.names[strings.ToLower(who.Name)]
}

// describe lists the principals for an error message.
func (p principals) describe() string {
	if p.all {
		return "every authenticated caller"
	}
	out := make([]string, 0, len(p.names))
	for n := range p.names {
		out = append(out, n)
	}
	return strings.Join(sortedStrings(out), ", ")
}

// canWrite reports whether who may take write actions, or why not.
func (a *api) canWrite(who Principal) error {
	if a.o.ReadOnly {
		return fail(http.StatusForbidden, "read_only", "this operations API is read-only (DLQREPLAY_READ_ONLY): nobody may replay, delete, re-push, seek or change consumers")
	}
	if !a.writers.allows(who) {
		return fail(http.StatusForbidden, "not_a_writer", "%s may read but not write: DLQREPLAY_WRITERS lists who may", who.Name)
	}
	return nil
}
