package dlqreplay_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/internal/deadletter"
	"github.com/relaybus/relaybus/internal/delivery"
	"github.com/relaybus/relaybus/internal/idtokentest"
	"github.com/relaybus/relaybus/shared/event"
)

const serviceURL = "https://relaybus-dlqreplay-abc123-ew.a.run.app"

// behindCloudRun is a service behind Cloud Run's IAM
// (DLQREPLAY_AUTH=cloudrun, on Cloud Run, its URL the audience):
// alice@example.com is an admin of everything (DLQREPLAY_WRITERS),
// bob@example.com a viewer, and nobody archives.
func behindCloudRun(o *dlqreplay.Options) {
	o.Auth, o.OnCloudRun, o.Audience = dlqreplay.AuthCloudRun, true, serviceURL
	o.Writers = []string{"alice@example.com"}
	o.Roles = []dlqreplay.Binding{{Member: "bob@example.com", Role: dlqreplay.RoleViewer}}
	o.Archivers = nil
}

// cloudRunToken is a Google ID token as a Cloud Run service behind IAM
// receives it: the platform verified it and replaced its signature
// (https://cloud.google.com/run/docs/authenticating/service-to-service),
// the header and claims are untouched. claims change the defaults (a nil
// value deletes).
func cloudRunToken(claims map[string]any) string {
	return idtokentest.Stripped(tokenClaims(claims))
}

func tokenClaims(claims map[string]any) map[string]any {
	now := time.Now().Unix()
	c := map[string]any{"iss": "https://accounts.google.com", "aud": serviceURL, "azp": "32555940559.apps.googleusercontent.com",
		"iat": now, "exp": now + 3600}
	for k, v := range claims {
		if v == nil {
			delete(c, k)
		} else {
			c[k] = v
		}
	}
	return c
}

func person(email string) map[string]any {
	return map[string]any{"email": email, "email_verified": true, "sub": "1000" + email[:1]}
}

// with returns claims with changes.
func with(claims map[string]any, changes map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range claims {
		out[k] = v
	}
	for k, v := range changes {
		out[k] = v
	}
	return out
}

type authCase struct {
	name    string
	method  string
	path    string
	headers map[string]string
	body    any
	want    int
	code    string // the error code, for non-200 answers
	caller  string // whoami's caller, for 200 answers of /whoami
	canW    *bool
}

func yes() *bool { b := true; return &b }
func no() *bool  { b := false; return &b }

func runAuth(t *testing.T, e *env, cases []authCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var body []byte
			switch b := c.body.(type) {
			case nil:
			case []byte:
				body = b
			default:
				body, _ = json.Marshal(b)
			}
			method := c.method
			if method == "" {
				method = "GET"
			}
			path := c.path
			if path == "" {
				path = "/whoami"
			}
			req, _ := http.NewRequest(method, e.url+path, bytes.NewReader(body))
			for k, v := range c.headers {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var out map[string]any
			_ = json.NewDecoder(resp.Body).Decode(&out)
			if resp.StatusCode != c.want {
				t.Fatalf("%s %s: %d %v, want %d", method, path, resp.StatusCode, out, c.want)
			}
			if c.code != "" && out["code"] != c.code {
				t.Errorf("code %v, want %s (%v)", out["code"], c.code, out["message"])
			}
			if c.caller != "" && out["caller"] != c.caller {
				t.Errorf("caller %v, want %s", out["caller"], c.caller)
			}
			if c.canW != nil && out["canWrite"] != *c.canW {
				t.Errorf("canWrite %v, want %v (%v)", out["canWrite"], *c.canW, out["why"])
			}
		})
	}
}

func bearerOf(claims map[string]any) map[string]string {
	return map[string]string{"Authorization": "Bearer " + cloudRunToken(claims)}
}

// archiveBody is a DLQ monitor's push delivery of one dead letter.
func archiveBody(id string) []byte {
	m := deadletter.Poison(event.Message{Data: []byte(`{}`), Attributes: map[string]string{"event_id": "evt-" + id}},
		event.ReasonMissingAggregateID, "no aggregate id", "member-service", "shop.order.events.member-service-processor", time.Now())
	m.ID = id
	return delivery.WrappedBody(m, "projects/p/subscriptions/shop.order.events.dlq-monitor", 1)
}

// DLQREPLAY_AUTH=cloudrun, with tokens shaped as Cloud Run delivers them:
// the claims are read and their issuer, expiry and audience checked again;
// a caller without a role is refused everything but whoami.
func TestCloudRunAuth(t *testing.T) {
	monitor := "dlq-monitor@relaybus-prod.iam.gserviceaccount.com"
	e := newEnvWith(t, func(o *dlqreplay.Options) {
		behindCloudRun(o)
		o.Writers = []string{"user:Alice@example.com", "ops-bot@relaybus-prod.iam.gserviceaccount.com"}
		o.Archivers = []string{"serviceAccount:" + monitor}
	})
	alice, bob, carol := person("alice@example.com"), person("bob@example.com"), person("carol@example.com")
	dayAgo := time.Now().Add(-24 * time.Hour).Unix()
	runAuth(t, e, []authCase{
		{name: "no token", want: 401, code: "unauthenticated"},
		{name: "not a JWT", headers: map[string]string{"Authorization": "Bearer abc"}, want: 401, code: "unauthenticated"},
		{name: "claims not base64 JSON", headers: map[string]string{"Authorization": "Bearer eyJhbGciOiJSUzI1NiJ9.%%%.SIGNATURE_REMOVED_BY_GOOGLE"}, want: 401},
		{name: "basic auth", headers: map[string]string{"Authorization": "Basic YWxpY2U6eA=="}, want: 401},
		{name: "not issued by Google", headers: bearerOf(with(alice, map[string]any{"iss": "https://evil.example"})), want: 401},
		{name: "no caller in the claims", headers: bearerOf(map[string]any{"sub": nil}), want: 401},
		{name: "expired a day ago", headers: bearerOf(with(alice, map[string]any{"exp": dayAgo, "iat": dayAgo - 3600})), want: 401, code: "unauthenticated"},
		{name: "another service's token", headers: bearerOf(with(alice, map[string]any{"aud": "https://other-abc-ew.a.run.app"})), want: 401, code: "unauthenticated"},
		{name: "in an audience list", headers: bearerOf(with(alice, map[string]any{"aud": []string{"x", serviceURL}})), want: 200, caller: "alice@example.com"},
		{name: "a writer, stripped signature", headers: bearerOf(alice), want: 200, caller: "alice@example.com", canW: yes()},
		{name: "a caller known by sub only", headers: bearerOf(map[string]any{"sub": "112233445566"}), want: 200, caller: "112233445566", canW: no()},
		{name: "a viewer", headers: bearerOf(bob), want: 200, caller: "bob@example.com", canW: no()},
		{name: "X-Serverless-Authorization wins, Authorization is the app's", headers: map[string]string{
			"X-Serverless-Authorization": "Bearer " + cloudRunToken(alice), "Authorization": "Basic Ym9iOng="}, want: 200, caller: "alice@example.com"},
		{name: "a viewer may read", path: "/deadletters", headers: bearerOf(bob), want: 200},
		{name: "a caller with no role may not read", path: "/deadletters", headers: bearerOf(carol), want: 403, code: "forbidden"},
		{name: "nor read the audit log", path: "/audit", headers: bearerOf(carol), want: 403, code: "forbidden"},
		{name: "a viewer reads the catalog", path: "/catalog", headers: bearerOf(bob), want: 200},
		{name: "a caller with no role may not", path: "/catalog", headers: bearerOf(carol), want: 403, code: "forbidden"},
		{name: "a viewer may not delete", method: "DELETE", path: "/deadletters/dl-1", headers: bearerOf(bob), want: 403, code: "forbidden"},
		{name: "a viewer may not change the registry", method: "POST", path: "/consumers/shop.order.events/member-service:disable", headers: bearerOf(bob), want: 403, code: "forbidden"},
		{name: "a writer passes auth (then 404)", method: "DELETE", path: "/deadletters/dl-1", headers: bearerOf(alice), want: 404, code: "not_found"},
		{name: "a viewer may dry-run", method: "POST", path: "/deadletters:replay", body: map[string]any{"reason": "x", "dryRun": true}, headers: bearerOf(bob), want: 200},
		{name: "a viewer may not replay", method: "POST", path: "/deadletters:replay", body: map[string]any{"reason": "x"}, headers: bearerOf(bob), want: 403, code: "forbidden"},
		{name: "the DLQ monitor archives", method: "POST", path: "/deadletters:archive", body: archiveBody("m1"), headers: bearerOf(person(monitor)), want: 200},
		{name: "a writer is not an archiver", method: "POST", path: "/deadletters:archive", body: archiveBody("m2"), headers: bearerOf(alice), want: 403, code: "not_an_archiver"},
	})
	for name, o := range map[string]dlqreplay.Options{
		"off Cloud Run":    {Auth: dlqreplay.AuthCloudRun, Audience: serviceURL},
		"with no audience": {Auth: dlqreplay.AuthCloudRun, OnCloudRun: true},
	} {
		o.Archive, o.Ledger, o.DB, o.Publisher = e.archive, e.store, e.db, e.fake.Client
		if _, err := dlqreplay.New(o); err == nil {
			t.Errorf("cloudrun %s: started", name)
		}
	}
}

// DLQREPLAY_AUTH=iam verifies the token itself: its signature against the
// keys (here a local key served by httptest), its issuer, expiry and
// audience, which must be configured. A token whose signature Cloud Run
// removed cannot pass (the reason cloudrun exists), nor can a Google token
// minted for another service.
func TestIAMAuthVerifiesTokens(t *testing.T) {
	is := idtokentest.New(t)
	e := newEnvWith(t, func(o *dlqreplay.Options) {
		o.Auth, o.Audience, o.KeysURL = dlqreplay.AuthIAM, serviceURL, is.KeysURL()
		o.Writers = []string{"alice@example.com"}
	})
	signed := func(claims map[string]any) map[string]string {
		return map[string]string{"Authorization": "Bearer " + is.Sign(claims)}
	}
	good := idtokentest.Claims("alice@example.com", serviceURL)
	runAuth(t, e, []authCase{
		{name: "signed", headers: signed(good), want: 200, caller: "alice@example.com", canW: yes()},
		{name: "stripped", headers: bearerOf(person("alice@example.com")), want: 401, code: "unauthenticated"},
		{name: "another service's audience", headers: signed(with(good, map[string]any{"aud": "https://other.a.run.app"})), want: 401, code: "unauthenticated"},
		{name: "expired", headers: signed(with(good, map[string]any{"exp": time.Now().Add(-time.Hour).Unix()})), want: 401, code: "unauthenticated"},
		{name: "signed by another key", headers: map[string]string{"Authorization": "Bearer " + idtokentest.New(t).Sign(good)}, want: 401, code: "unauthenticated"},
		{name: "none", want: 401},
	})
	// Without an audience any Google ID token would pass: it does not start.
	o := dlqreplay.Options{Archive: e.archive, Ledger: e.store, DB: e.db, Publisher: e.fake.Client, Auth: dlqreplay.AuthIAM}
	if _, err := dlqreplay.New(o); err == nil || !strings.Contains(err.Error(), "DLQREPLAY_AUDIENCE") {
		t.Errorf("iam without an audience: %v, want refused naming DLQREPLAY_AUDIENCE", err)
	}
	o.Auth = ""
	if _, err := dlqreplay.New(o); err == nil {
		t.Error("the default mode (iam) started without an audience")
	}
}

// personalTokens is DLQREPLAY_TOKEN: each holder's own token.
const personalTokens = `{"alice@example.com": "alice-0123456789abcdef0123456789abcdef", "bob@example.com": "bob-0123456789abcdef0123456789abcdef0"}`

// DLQREPLAY_AUTH=token: personal tokens, so the caller is the holder (the
// audit log names who acted, not "token"); the DLQ monitors' push is
// authenticated by its OIDC token, verified, or, with its signature
// removed by Cloud Run's IAM, taken only on Cloud Run.
func TestTokenAuth(t *testing.T) {
	monitor := "relaybus-dlq-push@relaybus-prod.iam.gserviceaccount.com"
	is := idtokentest.New(t)
	opts := func(onRun bool) func(o *dlqreplay.Options) {
		return func(o *dlqreplay.Options) {
			o.Auth, o.Token, o.Audience, o.KeysURL, o.OnCloudRun = dlqreplay.AuthToken, personalTokens, serviceURL, is.KeysURL(), onRun
			o.Archivers, o.Writers = []string{"serviceAccount:" + monitor}, []string{"alice@example.com"}
			o.Roles = []dlqreplay.Binding{{Member: "bob@example.com", Role: dlqreplay.RoleViewer}}
		}
	}
	e := newEnvWith(t, opts(true))
	alice := map[string]string{dlqreplay.TokenHeader: "alice-0123456789abcdef0123456789abcdef"}
	dayAgo := time.Now().Add(-24 * time.Hour).Unix()
	runAuth(t, e, []authCase{
		{name: "none", want: 401, code: "unauthenticated"},
		{name: "wrong", headers: map[string]string{dlqreplay.TokenHeader: "alice-0123456789abcdef0123456789abcde"}, want: 401},
		{name: "in Authorization instead of its header", headers: map[string]string{"Authorization": "Bearer alice-0123456789abcdef0123456789abcdef"}, want: 401},
		{name: "alice's, with Cloud Run's ID token beside it", headers: map[string]string{dlqreplay.TokenHeader: "alice-0123456789abcdef0123456789abcdef",
			"Authorization": "Bearer " + cloudRunToken(person("alice@example.com"))}, want: 200, caller: "alice@example.com", canW: yes()},
		{name: "bob's names bob", headers: map[string]string{dlqreplay.TokenHeader: "bob-0123456789abcdef0123456789abcdef0"}, want: 200, caller: "bob@example.com", canW: no()},
		{name: "the DLQ monitor's push, Cloud Run verified", method: "POST", path: "/deadletters:archive", body: archiveBody("t1"),
			headers: bearerOf(person(monitor)), want: 200},
		{name: "the DLQ monitor's push, signed", method: "POST", path: "/deadletters:archive", body: archiveBody("t1s"),
			headers: map[string]string{"Authorization": "Bearer " + is.Sign(tokenClaims(person(monitor)))}, want: 200},
		// The reproduced finding: an unsigned token that had expired a day
		// earlier archived as the push account.
		{name: "push with a token that expired a day ago", method: "POST", path: "/deadletters:archive", body: archiveBody("t0"),
			headers: bearerOf(with(person(monitor), map[string]any{"exp": dayAgo, "iat": dayAgo - 3600})), want: 401, code: "unauthenticated"},
		{name: "push for another audience", method: "POST", path: "/deadletters:archive", body: archiveBody("t0a"),
			headers: bearerOf(with(person(monitor), map[string]any{"aud": "https://other.a.run.app"})), want: 401, code: "unauthenticated"},
		{name: "push with an unverified email", method: "POST", path: "/deadletters:archive", body: archiveBody("t2"),
			headers: bearerOf(map[string]any{"email": monitor, "sub": "998877"}), want: 401, code: "unauthenticated"},
		{name: "push from another account", method: "POST", path: "/deadletters:archive", body: archiveBody("t3"),
			headers: bearerOf(person("alice@example.com")), want: 403, code: "not_an_archiver"},
		{name: "a personal token does not archive", method: "POST", path: "/deadletters:archive", body: archiveBody("t4"),
			headers: alice, want: 401, code: "unauthenticated"},
		{name: "a forged signature is refused", method: "POST", path: "/deadletters:archive", body: archiveBody("t5"),
			headers: map[string]string{"Authorization": "Bearer " + idtokentest.New(t).Sign(tokenClaims(person(monitor)))}, want: 401, code: "unauthenticated"},
		{name: "the push token does not open the other routes", path: "/deadletters",
			headers: bearerOf(person(monitor)), want: 401, code: "unauthenticated"},
	})
	// Off Cloud Run nobody verified a stripped token: it is refused, and a
	// signed one still verifies.
	off := newEnvWith(t, opts(false))
	runAuth(t, off, []authCase{
		{name: "stripped, off Cloud Run", method: "POST", path: "/deadletters:archive", body: archiveBody("o1"),
			headers: bearerOf(person(monitor)), want: 401, code: "unauthenticated"},
		{name: "signed, off Cloud Run", method: "POST", path: "/deadletters:archive", body: archiveBody("o2"),
			headers: map[string]string{"Authorization": "Bearer " + is.Sign(tokenClaims(person(monitor)))}, want: 200},
	})
	for _, c := range []struct {
		o    dlqreplay.Options
		want string
	}{
		{dlqreplay.Options{Auth: dlqreplay.AuthToken}, "DLQREPLAY_TOKEN"},
		{dlqreplay.Options{Auth: dlqreplay.AuthToken, Token: "s3cret"}, "JSON object"},
		{dlqreplay.Options{Auth: dlqreplay.AuthToken, Token: `{"alice@example.com": "short"}`}, "shorter"},
		{dlqreplay.Options{Auth: dlqreplay.AuthToken, Token: personalTokens}, "DLQREPLAY_ARCHIVERS"},
		{dlqreplay.Options{Auth: dlqreplay.AuthToken, Token: personalTokens, Archivers: []string{monitor}}, "DLQREPLAY_AUDIENCE"},
	} {
		c.o.Archive, c.o.Ledger, c.o.DB, c.o.Publisher = e.archive, e.store, e.db, e.fake.Client
		if _, err := dlqreplay.New(c.o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("token mode, %+v: %v, want an error naming %s", c.o.Token, err, c.want)
		}
	}
}

// DLQREPLAY_READ_ONLY: every action refused, every read and dry run
// answered; whoami says so.
func TestReadOnly(t *testing.T) {
	e := newEnvWith(t, func(o *dlqreplay.Options) {
		behindCloudRun(o)
		o.ReadOnly, o.Archivers = true, []string{"alice@example.com"}
	})
	alice := bearerOf(person("alice@example.com"))
	runAuth(t, e, []authCase{
		{name: "whoami", headers: alice, want: 200, canW: no()},
		{name: "list", path: "/events", headers: alice, want: 200},
		{name: "catalog", path: "/catalog", headers: alice, want: 200},
		{name: "delete", method: "DELETE", path: "/deadletters/dl-1", headers: alice, want: 404}, // the letter is read first
		{name: "bulk replay", method: "POST", path: "/deadletters:replay", body: map[string]any{"reason": "x"}, headers: alice, want: 403, code: "read_only"},
		{name: "bulk dry run", method: "POST", path: "/deadletters:replay", body: map[string]any{"reason": "x", "dryRun": true}, headers: alice, want: 200},
		{name: "re-push dry run", method: "POST", path: "/events/evt-1:repush", body: map[string]any{"dryRun": true}, headers: alice, want: 404},
		{name: "add a consumer", method: "POST", path: "/consumers", body: map[string]any{"topic": "shop.order.events", "consumerId": "x"}, headers: alice, want: 403, code: "read_only"},
		{name: "disable a consumer", method: "POST", path: "/consumers/shop.order.events/member-service:disable", headers: alice, want: 403, code: "read_only"},
		{name: "seek", method: "POST", path: "/subscriptions/shop.order.events.member-service-processor:seek", body: map[string]any{"time": "2026-01-01T00:00:00Z"}, headers: alice, want: 403, code: "read_only"},
		{name: "archive is not an operator's action", method: "POST", path: "/deadletters:archive", body: archiveBody("m3"), headers: alice, want: 200},
		{name: "delete an archived letter", method: "DELETE", path: "/deadletters/m3", headers: alice, want: 403, code: "read_only"},
		{name: "replay it", method: "POST", path: "/deadletters/m3:replay", headers: alice, want: 403, code: "read_only"},
	})
}

// Closed by default: an empty list lets nobody in, and nothing that cannot
// be checked against a token (a group, a domain) or that would let anyone
// in (*) is taken.
func TestPrincipalListsAreClosed(t *testing.T) {
	e := newEnvWith(t, func(o *dlqreplay.Options) { behindCloudRun(o); o.Writers = nil; o.Roles = nil })
	runAuth(t, e, []authCase{
		{name: "no role: whoami says so", headers: bearerOf(person("alice@example.com")), want: 200, caller: "alice@example.com", canW: no()},
		{name: "no role: no read", path: "/events", headers: bearerOf(person("alice@example.com")), want: 403, code: "forbidden"},
		{name: "no archivers: nobody archives", method: "POST", path: "/deadletters:archive", body: archiveBody("c1"), headers: bearerOf(person("alice@example.com")), want: 403, code: "not_an_archiver"},
	})
	for _, o := range []dlqreplay.Options{
		{Writers: []string{"group:ops@example.com"}},
		{Writers: []string{"*"}},
		{Archivers: []string{"domain:example.com"}},
		{Archivers: []string{"*"}},
		{Roles: []dlqreplay.Binding{{Member: "group:ops@example.com", Role: dlqreplay.RoleAdmin}}}, // no group checker
		{Roles: []dlqreplay.Binding{{Member: "alice@example.com", Role: "owner"}}},
	} {
		o.Archive, o.Ledger, o.DB, o.Publisher, o.Auth = e.archive, e.store, e.db, e.fake.Client, dlqreplay.AuthNone
		if _, err := dlqreplay.New(o); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
}
