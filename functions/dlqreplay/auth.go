package dlqreplay

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"

	"github.com/relaybus/relaybus/internal/identity"
)

// Auth modes (DLQREPLAY_AUTH). Each names the caller; what the caller may
// do is their roles' business (rights.go).
const (
	// AuthCloudRun trusts Cloud Run's IAM: the platform verified the
	// caller's Google ID token before the request arrived and hands it on
	// with its signature replaced by SIGNATURE_REMOVED_BY_GOOGLE
	// (https://cloud.google.com/run/docs/authenticating/service-to-service),
	// so the token cannot be verified again; the caller is read from its
	// claims, whose issuer, expiry and audience (Audience, required) are
	// checked again. It runs only on Cloud Run (OnCloudRun), on a service
	// whose invokers IAM restricts (never allUsers).
	AuthCloudRun = "cloudrun"
	// AuthIAM verifies a Google ID token itself: its signature against
	// Google's keys, its issuer, its expiry and its audience (Audience,
	// required: without it any Google token would pass). For a service
	// behind a load balancer or proxy that keeps the signature.
	AuthIAM = "iam"
	// AuthToken takes a personal token in the header TokenHeader:
	// DLQREPLAY_TOKEN holds each holder's name and token, so the caller is
	// the holder (the audit log names who acted). The token travels in
	// its own header because Cloud Run's IAM needs Authorization for the ID
	// token.
	AuthToken = "token"
	// AuthNone names every caller "anonymous" (a local stack).
	AuthNone = "none"
	// AuthPushOIDC names, in a Principal's Method, the push subscription
	// OIDC token that authenticates POST /deadletters:archive under
	// AuthToken (see pushIdentity); it is not a DLQREPLAY_AUTH mode.
	AuthPushOIDC = "push-oidc"
)

// TokenHeader carries the personal token of AuthToken.
const TokenHeader = "X-Relaybus-Token"

// minTokenLength is the shortest personal token AuthToken takes.
const minTokenLength = 32

// Principal is an authenticated caller.
type Principal struct {
	// Name identifies the caller in logs and the audit log: the ID token's
	// verified email (its subject when it has none), a token's holder or
	// "anonymous".
	Name string `json:"name"`
	// Method is the auth mode that accepted the caller.
	Method string `json:"method"`
}

// Anonymous is the caller of AuthNone.
const Anonymous = "anonymous"

// authenticator names callers in one auth mode.
type authenticator struct {
	mode     string
	cloudRun identity.CloudRun
	verifier *identity.Verifier
	tokens   map[string]string // token -> holder
	onRun    bool
}

// newAuthenticator checks the options of o's auth mode and builds it.
func newAuthenticator(o *Options) (*authenticator, error) {
	au := &authenticator{mode: o.Auth, onRun: o.OnCloudRun}
	var audiences []string
	for _, a := range strings.Split(o.Audience, ",") {
		if a = strings.TrimSpace(a); a != "" {
			audiences = append(audiences, a)
		}
	}
	needAudience := func() error {
		if len(audiences) == 0 {
			return fmt.Errorf("dlqreplay: DLQREPLAY_AUTH=%s needs DLQREPLAY_AUDIENCE (the service's URL, comma-separated if several): without it, a Google ID token minted for any other service would pass", o.Auth)
		}
		return nil
	}
	verifier := func() error {
		if err := needAudience(); err != nil {
			return err
		}
		v, err := identity.NewVerifier(identity.VerifierOptions{Audiences: audiences, KeysURL: o.KeysURL, HTTPClient: o.KeysClient})
		au.verifier = v
		return err
	}
	switch o.Auth {
	case AuthNone:
	case AuthCloudRun:
		if !o.OnCloudRun {
			return nil, errors.New("dlqreplay: DLQREPLAY_AUTH=cloudrun reads the caller from the ID token Cloud Run's IAM verified, so it runs only on Cloud Run (K_SERVICE is not set); elsewhere use iam, which verifies tokens itself")
		}
		if err := needAudience(); err != nil {
			return nil, err
		}
		au.cloudRun = identity.CloudRun{Audiences: audiences}
	case AuthIAM:
		if err := verifier(); err != nil {
			return nil, err
		}
	case AuthToken:
		tokens, err := parseTokens(o.Token)
		if err != nil {
			return nil, err
		}
		au.tokens = tokens
		if len(o.Archivers) == 0 {
			return nil, errors.New("dlqreplay: DLQREPLAY_AUTH=token needs DLQREPLAY_ARCHIVERS (the DLQ monitors' push service account): POST /deadletters:archive is authenticated by the push subscription's OIDC token, since push cannot send X-Relaybus-Token")
		}
		// The push token is verified (its signature, or, on Cloud Run,
		// the claims the platform checked) for the service's audience.
		if err := verifier(); err != nil {
			return nil, err
		}
		au.cloudRun = identity.CloudRun{Audiences: audiences}
	default:
		return nil, fmt.Errorf("dlqreplay: DLQREPLAY_AUTH=%q: want cloudrun, iam, token or none", o.Auth)
	}
	return au, nil
}

// parseTokens reads DLQREPLAY_TOKEN: a JSON object from each holder's name
// (their email) to their personal token.
func parseTokens(s string) (map[string]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, errors.New("dlqreplay: DLQREPLAY_AUTH=token needs DLQREPLAY_TOKEN (a Secret Manager secret): a JSON object from each holder's email to their token")
	}
	var byHolder map[string]string
	if err := json.Unmarshal([]byte(s), &byHolder); err != nil {
		return nil, errors.New("dlqreplay: DLQREPLAY_TOKEN: want a JSON object from each holder's email to their personal token, so the audit log names who acted (one shared token would name everybody \"token\")")
	}
	out := map[string]string{}
	for holder, tok := range byHolder {
		holder = strings.ToLower(strings.TrimSpace(holder))
		if holder == "" || strings.ContainsAny(holder, " ,") {
			return nil, fmt.Errorf("dlqreplay: DLQREPLAY_TOKEN: %q is not a holder's name (their email)", holder)
		}
		if len(tok) < minTokenLength {
			return nil, fmt.Errorf("dlqreplay: DLQREPLAY_TOKEN: %s's token is shorter than %d characters", holder, minTokenLength)
		}
		if _, dup := out[tok]; dup {
			return nil, fmt.Errorf("dlqreplay: DLQREPLAY_TOKEN: %s shares a token with another holder", holder)
		}
		out[tok] = holder
	}
	if len(out) == 0 {
		return nil, errors.New("dlqreplay: DLQREPLAY_TOKEN names no holder")
	}
	return out, nil
}

// authenticate names the caller of r, or says why it cannot.
func (au *authenticator) authenticate(r *http.Request) (Principal, error) {
	switch au.mode {
	case AuthNone:
		return Principal{Name: Anonymous, Method: AuthNone}, nil
	case AuthToken:
		got := r.Header.Get(TokenHeader)
		if got == "" {
			return Principal{}, fmt.Errorf("the %s header is required", TokenHeader)
		}
		// Compare with every token, each in constant time, so the time
		// taken says nothing of which one nearly matched.
		holder := ""
		for tok, h := range au.tokens {
			if subtle.ConstantTimeCompare([]byte(got), []byte(tok)) == 1 {
				holder = h
			}
		}
		if holder == "" {
			return Principal{}, fmt.Errorf("the %s header holds no token of DLQREPLAY_TOKEN", TokenHeader)
		}
		return Principal{Name: holder, Method: AuthToken}, nil
	case AuthIAM:
		c, err := au.verifier.Caller(r)
		if err != nil {
			return Principal{}, tokenError(err)
		}
		return Principal{Name: c.Name(), Method: AuthIAM}, nil
	}
	c, err := au.cloudRun.Caller(r)
	if err != nil {
		return Principal{}, tokenError(err)
	}
	return Principal{Name: c.Name(), Method: AuthCloudRun}, nil
}

// tokenError says why an ID token was refused (a key set that could not be
// fetched is not the caller's fault, but still no identity).
func tokenError(err error) error {
	if errors.Is(err, identity.ErrNoToken) || errors.Is(err, identity.ErrInvalidToken) {
		return errors.New(strings.TrimPrefix(err.Error(), identity.ErrInvalidToken.Error()+": "))
	}
	return errors.New("the ID token could not be verified now (Google's keys are out of reach); retry")
}

// pushIdentity authenticates POST /deadletters:archive under AuthToken.
// Pub/Sub push cannot add a header, so the DLQ monitors cannot send
// X-Relaybus-Token; they send what push can: the OIDC token of their push
// service account in Authorization
// (https://cloud.google.com/pubsub/docs/authenticate-push-subscriptions).
// A token that still has its signature is verified here (signature,
// issuer, expiry, audience). Behind Cloud Run IAM the platform verified
// it and replaced its signature (SIGNATURE_REMOVED_BY_GOOGLE): such a
// token is taken only on Cloud Run (OnCloudRun), with its issuer, expiry
// and audience checked again; anywhere else anyone could have written it.
// Either way it must name a verified email; the route then admits only
// Archivers (which New requires in token mode).
func (au *authenticator) pushIdentity(r *http.Request) (Principal, error) {
	tok := identity.Bearer(r)
	if tok == "" {
		return Principal{}, errors.New("POST /deadletters:archive takes the push subscription's OIDC token (Authorization: Bearer), not X-Relaybus-Token: Pub/Sub push cannot add headers")
	}
	var (
		claims identity.Claims
		err    error
	)
	switch {
	case !identity.Stripped(tok):
		claims, err = au.verifier.Verify(r.Context(), tok)
	case au.onRun:
		claims, err = au.cloudRun.Claims(tok)
	default:
		return Principal{}, fmt.Errorf("the push OIDC token's signature was removed (%s) and this service does not run on Cloud Run, whose IAM would have verified it: it cannot be trusted", identity.StrippedSignature)
	}
	if err != nil {
		return Principal{}, tokenError(err)
	}
	if !claims.EmailVerified || claims.Email == "" {
		return Principal{}, errors.New("the push OIDC token has no verified email (a push subscription's service account has one)")
	}
	return Principal{Name: strings.ToLower(claims.Email), Method: AuthPushOIDC}, nil
}

// principals is a parsed list of principals (DLQREPLAY_ARCHIVERS).
type principals struct {
	names map[string]bool
}

// parsePrincipals reads a comma-separated list of principals: emails (an
// IAM member prefix user: or serviceAccount: is dropped), subjects, or
// anonymous. Empty lets nobody in. Groups, domains and * are refused: a
// token cannot be matched against the first two, and the last would let
// every caller in.
func parsePrincipals(variable string, list []string) (principals, error) {
	p := principals{names: map[string]bool{}}
	for _, raw := range list {
		s := strings.TrimSpace(raw)
		switch {
		case s == "":
			continue
		case s == "*":
			return principals{}, fmt.Errorf("%s: * is not allowed: name each principal (closed by default)", variable)
		case strings.HasPrefix(s, "group:"), strings.HasPrefix(s, "domain:"), strings.Contains(s, " "):
			return principals{}, fmt.Errorf("%s: %q: list emails (user: or serviceAccount: prefixes are fine), subjects or anonymous; groups and domains cannot be checked against an ID token", variable, s)
		}
		if _, rest, ok := strings.Cut(s, ":"); ok && (strings.HasPrefix(s, "user:") || strings.HasPrefix(s, "serviceAccount:")) {
			s = rest
		}
		p.names[strings.ToLower(s)] = true
	}
	return p, nil
}

func (p principals) allows(who Principal) bool { return p.names[strings.ToLower(who.Name)] }

// list returns the principals, sorted.
func (p principals) list() []string {
	out := make([]string, 0, len(p.names))
	for n := range p.names {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
