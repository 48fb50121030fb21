package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/internal/archive"
	"github.com/relaybus/relaybus/internal/inbox"
)

// relaybus forwarders add, ls, set and rm against the real API over the
// Firestore emulator, Postgres and pstest: each answer as a user reads
// it (testdata/forwarders_*.golden), a refused field named with its rule.
func TestForwarderCommands(t *testing.T) {
	ctx := context.Background()
	top, store, pool, fake := cliBackends(t)
	if _, err := inbox.Migrations.Apply(ctx, pool); err != nil {
		t.Fatal(err)
	}
	h, err := dlqreplay.New(dlqreplay.Options{Archive: archive.New(store.Client()), Ledger: store, DB: pool, Publisher: fake.Client,
		Topology: top, Auth: dlqreplay.AuthNone, Writers: []string{dlqreplay.Anonymous}, RateLimit: -1, Broker: fake.Client,
		Forwarders: dlqreplay.ForwardersOptions{URL: "https://consume-forwarders-0a1b2c3d-ew.a.run.app", NoDeadLetterPolicy: true}})
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
		{"forwarders_rm", []string{"forwarders", "rm", "crm-webhook"}, 0},
		{"forwarders_ls_empty", []string{"forwarders", "ls"}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := run(ctx, append([]string{"--api", srv.URL}, c.args...), &out, &errOut, http.DefaultClient)
			if code != c.code {
				t.Fatalf("exit %d, want %d; stdout %s stderr %s", code, c.code, out.String(), errOut.String())
			}
			golden(t, c.name, append(out.Bytes(), errOut.Bytes()...))
		})
	}
}
