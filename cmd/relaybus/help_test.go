package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/internal/archive"
	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/ledger"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/internal/pubsubtest"
)

func runCLI(args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	code := run(context.Background(), args, &out, &errOut, http.DefaultClient)
	return code, out.String(), errOut.String()
}

// The help a new user gets: every command with a line, each command's own
// help with its flags. Compared with testdata/help_*.golden.
func TestHelp(t *testing.T) {
	t.Setenv("RELAYBUS_API", "")
	t.Setenv("RELAYBUS_TOKEN", "")
	code, main, errOut := runCLI("--help")
	if code != 0 || errOut != "" {
		t.Fatalf("--help: exit %d, stderr %q", code, errOut)
	}
	golden(t, "help_main", []byte(main))
	for _, args := range [][]string{{"-h"}, {"help"}} {
		if code, out, _ := runCLI(args...); code != 0 || out != main {
			t.Errorf("%v: exit %d, and not the same help as --help", args, code)
		}
	}
	if code, out, _ := runCLI(); code != 2 || out != main {
		t.Errorf("no command: exit %d (want 2) or not the help", code)
	}
	for _, c := range commands {
		if !strings.Contains(main, "  "+strings.TrimSpace(c.name()+" "+c.args)) || !strings.Contains(main, c.short) {
			t.Errorf("relaybus --help does not list %q with its line", c.name())
		}
		args := append(append([]string{}, c.path...), "--help")
		code, out, errOut := runCLI(args...)
		if code != 0 || errOut != "" || !strings.HasPrefix(out, c.short+"\n") || !strings.Contains(out, "usage: relaybus [global flags] "+c.name()) {
			t.Errorf("%v: exit %d, stderr %q, output:\n%s", args, code, errOut, out)
		}
		golden(t, "help_"+strings.ReplaceAll(c.name(), " ", "_"), []byte(out))
		if code, alias, _ := runCLI(append([]string{"help"}, c.path...)...); code != 0 || alias != out {
			t.Errorf("relaybus help %s: exit %d, and not the same as --help", c.name(), code)
		}
	}
	for _, group := range []string{"events", "dlq", "consumers", "snapshots"} {
		code, out, _ := runCLI(group, "--help")
		if code != 0 {
			t.Errorf("%s --help: exit %d", group, code)
		}
		golden(t, "help_group_"+group, []byte(out))
	}
}

// A Google ID token as gcloud prints it (signed; the signature here is
// just bytes).
func gcloudToken(claims map[string]any) string {
	enc := func(v any) string {
		b, _ := json.Marshal(v)
		return base64.RawURLEncoding.EncodeToString(b)
	}
	return enc(map[string]string{"alg": "RS256", "kid": "k1", "typ": "JWT"}) + "." + enc(claims) + "." + base64.RawURLEncoding.EncodeToString([]byte("signature"))
}

// cloudRunFront stands in for Cloud Run's IAM in front of a service: it
// refuses a request without an ID token for the service and hands the token
// on with its signature replaced, as the platform does.
func cloudRunFront(next http.Handler, audience string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		parts := strings.Split(tok, ".")
		if !ok || len(parts) != 3 {
			http.Error(w, "Your client does not have permission to get URL", http.StatusForbidden)
			return
		}
		var claims map[string]any
		b, _ := base64.RawURLEncoding.DecodeString(parts[1])
		if json.Unmarshal(b, &claims) != nil || (claims["aud"] != audience && claims["aud"] != "32555940559.apps.googleusercontent.com") {
			http.Error(w, "Your client does not have permission to get URL", http.StatusForbidden)
			return
		}
		r.Header.Set("Authorization", "Bearer "+parts[0]+"."+parts[1]+".SIGNATURE_REMOVED_BY_GOOGLE")
		next.ServeHTTP(w, r)
	})
}

// --gcloud-auth against a dlqreplay deployed with DLQREPLAY_AUTH=cloudrun
// behind Cloud Run IAM: a service account's token carries the service URL
// as its audience; a user account, which gcloud refuses a custom audience,
// falls back to its default token.
func TestGcloudAuthAgainstCloudRun(t *testing.T) {
	store, err := ledger.Open(context.Background(), ledger.Config{ProjectID: emutest.FirestoreProject(t)}, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	fake := pubsubtest.New(t)
	srv := httptest.NewServer(nil)
	defer srv.Close()
	// The audiences Cloud Run admits: the service's URL, and gcloud's
	// client id for a user's default token.
	h, err := dlqreplay.New(dlqreplay.Options{Archive: archive.New(store.Client()), Ledger: store, DB: pgtest.Schema(t), Publisher: fake.Client,
		Auth: dlqreplay.AuthCloudRun, OnCloudRun: true, Audience: srv.URL + ",32555940559.apps.googleusercontent.com",
		Writers: []string{"deployer@relaybus-prod.iam.gserviceaccount.com"},
		Roles:   []dlqreplay.Binding{{Member: "alice@example.com", Role: dlqreplay.RoleViewer}}})
	if err != nil {
		t.Fatal(err)
	}
	srv.Config.Handler = cloudRunFront(h, srv.URL)

	dir := t.TempDir()
	log := filepath.Join(dir, "calls")
	script := filepath.Join(dir, "gcloud")
	exp := time.Now().Add(time.Hour).Unix()
	sa := gcloudToken(map[string]any{"iss": "https://accounts.google.com", "aud": srv.URL, "email": "deployer@relaybus-prod.iam.gserviceaccount.com", "email_verified": true, "sub": "1", "exp": exp})
	user := gcloudToken(map[string]any{"iss": "https://accounts.google.com", "aud": "32555940559.apps.googleusercontent.com", "email": "alice@example.com", "email_verified": true, "sub": "2", "exp": exp})
	if err := os.WriteFile(script, []byte(`#!/bin/sh
echo "$*" >> `+log+`
case "$*" in
*--audiences=*)
  if [ -n "$FAKE_USER_ACCOUNT" ]; then
    echo "ERROR: (gcloud.auth.print-identity-token) Invalid account type for `+"`--audiences`"+`. Requires valid service account." >&2
    exit 1
  fi
  echo "`+sa+`";;
*) echo "`+user+`";;
esac
`), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("RELAYBUS_GCLOUD", script)
	for _, c := range []struct {
		name, user, caller, canWrite string
		calls                        string
	}{
		{"service account", "", "deployer@relaybus-prod.iam.gserviceaccount.com", "true", "auth print-identity-token --audiences=" + srv.URL + "\n"},
		{"user account", "1", "alice@example.com", "false", "auth print-identity-token --audiences=" + srv.URL + "\nauth print-identity-token\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_ = os.Remove(log)
			t.Setenv("FAKE_USER_ACCOUNT", c.user)
			code, out, errOut := runCLI("-url", srv.URL, "-gcloud-auth", "-o", "json", "whoami") // as infra's docs spell it
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			var who map[string]any
			_ = json.Unmarshal([]byte(out), &who)
			if who["caller"] != c.caller || who["auth"] != "cloudrun" || who["canWrite"] != (c.canWrite == "true") {
				t.Errorf("whoami %v, want %s (canWrite %s)", who, c.caller, c.canWrite)
			}
			calls, _ := os.ReadFile(log)
			if string(calls) != c.calls {
				t.Errorf("gcloud called with\n%s\nwant\n%s", calls, c.calls)
			}
		})
	}
	// Without --gcloud-auth, Cloud Run's front refuses the call.
	if code, _, errOut := runCLI("--api", srv.URL, "whoami"); code != 1 || !strings.Contains(errOut, "403") {
		t.Errorf("no token: exit %d, %s", code, errOut)
	}
	// gcloud failing is said, not hidden.
	t.Setenv("RELAYBUS_GCLOUD", filepath.Join(dir, "no-such-gcloud"))
	if code, _, errOut := runCLI("--api", srv.URL, "--gcloud-auth", "whoami"); code != 1 || !strings.Contains(errOut, "gcloud auth print-identity-token") {
		t.Errorf("no gcloud: exit %d, %s", code, errOut)
	}
}
