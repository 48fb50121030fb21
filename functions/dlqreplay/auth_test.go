package dlqreplay_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/shared/deadletter"
	"github.com/relaybus/relaybus/shared/delivery"
	"github.com/relaybus/relaybus/shared/event"
)

const serviceURL = "https://relaybus-dlqreplay-abc123-ew.a.run.app"

// cloudRunToken is a Google ID token as a Cloud Run service behind IAM
// receives it: the platform verified it and replaced its signature
// (https://cloud.google.com/run/docs/authenticating/service-to-service),
// the header and claims are untouched.
func cloudRunToken(claims map[string]any) string {
	enc := func(v any) string {
		b, _ := json.Marshal(v)
		return base64.RawURLEncoding.EncodeToString(b)
	}
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
	return enc(map[string]string{"alg": "RS256", "kid": "a1b2c3", "typ": "JWT"}) + "." + enc(c) + ".SIGNATURE_REMOVED_BY_GOOGLE"
}

func person(email string) map[string]any {
	return map[string]any{"email": email, "email_verified": true, "sub": "1000" + email[:1]}
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

// DLQREPLAY_AUTH=cloudrun, with tokens shaped as Cloud Run delivers them.
func TestCloudRunAuth(t *testing.T) {
	monitor := "dlq-monitor@relaybus-prod.iam.gserviceaccount.com"
	e := newEnvWith(t, func(o *dlqreplay.Options) {
		o.Auth = dlqreplay.AuthCloudRun
		o.Writers = []string{"user:Alice@example.com", "ops-bot@relaybus-prod.iam.gserviceaccount.com"}
		o.Archivers = []string{"serviceAccount:" + monitor}
	})
	alice, bob := person("alice@example.com"), person("bob@example.com")
	runAuth(t, e, []authCase{
		{name: "no token", want: 401, code: "unauthenticated"},
		{name: "not a JWT", headers: map[string]string{"Authorization": "Bearer abc"}, want: 401, code: "unauthenticated"},
		{name: "claims not base64 JSON", headers: map[string]string{"Authorization": "Bearer eyJhbGciOiJSUzI1NiJ9.%%%.SIGNATURE_REMOVED_BY_GOOGLE"}, want: 401},
		{name: "basic auth", headers: map[string]string{"Authorization": "Basic YWxpY2U6eA=="}, want: 401},
		{name: "not issued by Google", headers: bearerOf(map[string]any{"email": "alice@example.com", "iss": "https://evil.example"}), want: 401},
		{name: "no caller in the claims", headers: bearerOf(map[string]any{"sub": nil}), want: 401},
		{name: "a writer, stripped signature", headers: bearerOf(alice), want: 200, caller: "alice@example.com", canW: yes()},
		{name: "a service account known by sub only", headers: bearerOf(map[string]any{"sub": "112233445566"}), want: 200, caller: "112233445566", canW: no()},
		{name: "a reader", headers: bearerOf(bob), want: 200, caller: "bob@example.com", canW: no()},
		{name: "X-Serverless-Authorization wins, Authorization is the app's", headers: map[string]string{
			"X-Serverless-Authorization": "Bearer " + cloudRunToken(alice), "Authorization": "Basic Ym9iOng="}, want: 200, caller: "alice@example.com"},
		{name: "a reader may read", path: "/deadletters", headers: bearerOf(bob), want: 200},
		{name: "a reader may not delete", method: "DELETE", path: "/deadletters/dl-1", headers: bearerOf(bob), want: 403, code: "not_a_writer"},
		{name: "a reader may not change the registry", method: "POST", path: "/consumers/shop.order.events/member-service:disable", headers: bearerOf(bob), want: 403, code: "not_a_writer"},
		{name: "a writer passes auth (then 404)", method: "DELETE", path: "/deadletters/dl-1", headers: bearerOf(alice), want: 404, code: "not_found"},
		{name: "a reader may dry-run", method: "POST", path: "/deadletters:replay", body: map[string]any{"reason": "x", "dryRun": true}, headers: bearerOf(bob), want: 200},
		{name: "a reader may not replay", method: "POST", path: "/deadletters:replay", body: map[string]any{"reason": "x"}, headers: bearerOf(bob), want: 403, code: "not_a_writer"},
		{name: "the DLQ monitor archives", method: "POST", path: "/deadletters:archive", body: archiveBody("m1"), headers: bearerOf(map[string]any{"email": monitor, "sub": "998877"}), want: 200},
		{name: "a writer is not an archiver", method: "POST", path: "/deadletters:archive", body: archiveBody("m2"), headers: bearerOf(alice), want: 403, code: "not_an_archiver"},
	})
}

func TestCloudRunAuthChecksTheAudienceWhenGiven(t *testing.T) {
	e := newEnvWith(t, func(o *dlqreplay.Options) { o.Auth, o.Audience = dlqreplay.AuthCloudRun, serviceURL })
	runAuth(t, e, []authCase{
		{name: "its audience", headers: bearerOf(person("alice@example.com")), want: 200, caller: "alice@example.com", canW: yes()},
		{name: "in an audience list", headers: bearerOf(map[string]any{"email": "a@example.com", "aud": []string{"x", serviceURL}}), want: 200},
		{name: "another service's token", headers: bearerOf(map[string]any{"email": "a@example.com", "aud": "https://other-abc-ew.a.run.app"}), want: 401, code: "unauthenticated"},
	})
}

// DLQREPLAY_AUTH=iam verifies the signature itself: a token whose signature
// Cloud Run removed cannot pass (the reason cloudrun exists).
func TestIAMAuthRefusesAStrippedToken(t *testing.T) {
	e := newEnvWith(t, func(o *dlqreplay.Options) { o.Auth = dlqreplay.AuthIAM })
	runAuth(t, e, []authCase{
		{name: "stripped", headers: bearerOf(person("alice@example.com")), want: 401, code: "unauthenticated"},
		{name: "none", want: 401},
	})
}

func TestStaticTokenAuth(t *testing.T) {
	monitor := "relaybus-dlq-push@relaybus-prod.iam.gserviceaccount.com"
	e := newEnvWith(t, func(o *dlqreplay.Options) {
		o.Auth, o.Token, o.Archivers = dlqreplay.AuthToken, "s3cret", []string{"serviceAccount:" + monitor}
	})
	runAuth(t, e, []authCase{
		{name: "none", want: 401, code: "unauthenticated"},
		{name: "wrong", headers: map[string]string{dlqreplay.TokenHeader: "s3cre"}, want: 401},
		{name: "in Authorization instead of its header", headers: map[string]string{"Authorization": "Bearer s3cret"}, want: 401},
		{name: "right, with Cloud Run's ID token beside it", headers: map[string]string{dlqreplay.TokenHeader: "s3cret",
			"Authorization": "Bearer " + cloudRunToken(person("alice@example.com"))}, want: 200, caller: "token", canW: yes()},
		// Pub/Sub push cannot add X-Relaybus-Token: the DLQ monitors are
		// admitted by their push subscription's OIDC token (Cloud Run
		// verified it and stripped its signature), and only they.
		{name: "the DLQ monitor's push archives", method: "POST", path: "/deadletters:archive", body: archiveBody("t1"),
			headers: bearerOf(map[string]any{"email": monitor, "email_verified": true, "sub": "998877"}), want: 200},
		{name: "push with an unverified email", method: "POST", path: "/deadletters:archive", body: archiveBody("t2"),
			headers: bearerOf(map[string]any{"email": monitor, "sub": "998877"}), want: 401, code: "unauthenticated"},
		{name: "push from another account", method: "POST", path: "/deadletters:archive", body: archiveBody("t3"),
			headers: bearerOf(person("alice@example.com")), want: 403, code: "not_an_archiver"},
		{name: "the static token does not archive", method: "POST", path: "/deadletters:archive", body: archiveBody("t4"),
			headers: map[string]string{dlqreplay.TokenHeader: "s3cret"}, want: 401, code: "unauthenticated"},
		{name: "a signed token is verified, not trusted", method: "POST", path: "/deadletters:archive", body: archiveBody("t5"),
			headers: map[string]string{"Authorization": "Bearer " + strings.TrimSuffix(cloudRunToken(map[string]any{"email": monitor, "email_verified": true}), "SIGNATURE_REMOVED_BY_GOOGLE") + "Zm9yZ2Vk"},
			want:    401, code: "unauthenticated"},
		{name: "the push token does not open the other routes", path: "/deadletters",
			headers: bearerOf(map[string]any{"email": monitor, "email_verified": true}), want: 401, code: "unauthenticated"},
	})
	for _, c := range []struct {
		o    dlqreplay.Options
		want string
	}{
		{dlqreplay.Options{Auth: dlqreplay.AuthToken}, "DLQREPLAY_TOKEN"},
		{dlqreplay.Options{Auth: dlqreplay.AuthToken, Token: "s3cret"}, "DLQREPLAY_ARCHIVERS"},
	} {
		c.o.Archive, c.o.Ledger, c.o.DB, c.o.Publisher = e.archive, e.store, e.db, e.fake.Client
		if _, err := dlqreplay.New(c.o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("token mode without %s: %v", c.want, err)
		}
	}
}

// DLQREPLAY_READ_ONLY: every write refused, every read and dry run
// answered; whoami says so.
func TestReadOnly(t *testing.T) {
	e := newEnvWith(t, func(o *dlqreplay.Options) { o.Auth, o.ReadOnly = dlqreplay.AuthCloudRun, true })
	alice := bearerOf(person("alice@example.com"))
	runAuth(t, e, []authCase{
		{name: "whoami", headers: alice, want: 200, canW: no()},
		{name: "list", path: "/events", headers: alice, want: 200},
		{name: "delete", method: "DELETE", path: "/deadletters/dl-1", headers: alice, want: 403, code: "read_only"},
		{name: "replay", method: "POST", path: "/deadletters/dl-1:replay", headers: alice, want: 403, code: "read_only"},
		{name: "bulk replay", method: "POST", path: "/deadletters:replay", body: map[string]any{"reason": "x"}, headers: alice, want: 403, code: "read_only"},
		{name: "bulk dry run", method: "POST", path: "/deadletters:replay", body: map[string]any{"reason": "x", "dryRun": true}, headers: alice, want: 200},
		{name: "re-push", method: "POST", path: "/events/evt-1:repush", headers: alice, want: 403, code: "read_only"},
		{name: "re-push dry run", method: "POST", path: "/events/evt-1:repush", body: map[string]any{"dryRun": true}, headers: alice, want: 404},
		{name: "add a consumer", method: "POST", path: "/consumers", body: map[string]any{"topic": "shop.order.events", "consumerId": "x"}, headers: alice, want: 403, code: "read_only"},
		{name: "seek", method: "POST", path: "/subscriptions/shop.order.events.member-service-processor:seek", body: map[string]any{"time": "2026-01-01T00:00:00Z"}, headers: alice, want: 403, code: "read_only"},
		{name: "archive is not an operator's write", method: "POST", path: "/deadletters:archive", body: archiveBody("m3"), headers: alice, want: 200},
	})
}

func TestPrincipalListsRefuseWhatTheyCannotCheck(t *testing.T) {
	e := newEnv(t, dlqreplay.AuthNone, "")
	for _, o := range []dlqreplay.Options{
		{Writers: []string{"group:ops@example.com"}},
		{Archivers: []string{"domain:example.com"}},
	} {
		o.Archive, o.Ledger, o.DB, o.Publisher = e.archive, e.store, e.db, e.fake.Client
		if _, err := dlqreplay.New(o); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
}
