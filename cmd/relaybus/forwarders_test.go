package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"regexp"
	"testing"

	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/internal/archive"
	"github.com/relaybus/relaybus/internal/forwarders"
	"github.com/relaybus/relaybus/internal/inbox"
	"github.com/relaybus/relaybus/shared/forward"
)

// signingSecret finds the secret line of an hmac forwarder's answer.
var signingSecret = regexp.MustCompile(`signing secret: (whsec_[A-Za-z0-9+/=]+)`)

// relaybus forwarders add, ls, set and rm against the real API over the
// Firestore emulator, Postgres and pstest: each answer as a user reads
// it (testdata/forwarders_*.golden), a refused field named with its rule.
func TestForwarderCommands(t *testing.T) {
	ctx := context.Background()
	top, store, pool, fake := cliBackends(t)
	if _, err := inbox.Migrations.Apply(ctx, pool); err != nil {
		t.Fatal(err)
	}
	keys, err := forwarders.ParseKeys(forwarders.NewKey())
	if err != nil {
		t.Fatal(err)
	}
	h, err := dlqreplay.New(dlqreplay.Options{Archive: archive.New(store.Client()), Ledger: store, DB: pool, Publisher: fake.Client,
		Topology: top, Auth: dlqreplay.AuthNone, Writers: []string{dlqreplay.Anonymous}, RateLimit: -1, Broker: fake.Client,
		Forwarders: dlqreplay.ForwardersOptions{URL: "https://consume-forwarders-0a1b2c3d-ew.a.run.app", NoDeadLetterPolicy: true, Keys: keys}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	for _, c := range []struct {
		name string
		args []string
		code int
	}{
		{"forwarders_add", []string{"forwarders", "add", "--topic", "shop.order.events", "--url", "https://crm.example.com/hooks/orders",
			"--max-in-flight", "8", "--description", "The CRM's order webhook.", "crm-webhook"}, 0},
		{"forwarders_add_bad", []string{"forwarders", "add", "--topic", "shop.cart.events", "--url", "ftp://crm.example.com", "member-service"}, 1},
		{"forwarders_ls", []string{"forwarders", "ls"}, 0},
		{"forwarders_set", []string{"forwarders", "set", "--url", "https://crm.example.com/hooks/v2", "--max-per-second", "20", "crm-webhook"}, 0},
		{"forwarders_set_nothing", []string{"forwarders", "set", "crm-webhook"}, 2},
		{"forwarders_add_hmac", []string{"forwarders", "add", "--topic", "shop.order.events", "--url", "https://erp.example.com/hooks",
			"--auth", "hmac", "erp-webhook"}, 0},
		{"forwarders_set_rotate", []string{"forwarders", "set", "--rotate-secret", "erp-webhook"}, 0},
		{"forwarders_set_rotate_none", []string{"forwarders", "set", "--rotate-secret", "crm-webhook"}, 1},
		{"forwarders_rm", []string{"forwarders", "rm", "crm-webhook"}, 0},
		{"forwarders_rm_hmac", []string{"forwarders", "rm", "erp-webhook"}, 0},
		{"forwarders_ls_empty", []string{"forwarders", "ls"}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := run(ctx, append([]string{"--api", srv.URL}, c.args...), &out, &errOut, http.DefaultClient)
			if code != c.code {
				t.Fatalf("exit %d, want %d; stdout %s stderr %s", code, c.code, out.String(), errOut.String())
			}
			// A signing secret is printed once, on its own line; it is
			// random, so the golden file has a placeholder.
			got := append(out.Bytes(), errOut.Bytes()...)
			if m := signingSecret.FindSubmatch(got); m != nil {
				if _, err := forward.ParseSecret(string(m[1])); err != nil {
					t.Fatalf("the printed secret %q: %v", m[1], err)
				}
			}
			golden(t, c.name, signingSecret.ReplaceAll(got, []byte("signing secret: whsec_<the secret>")))
		})
	}
}
