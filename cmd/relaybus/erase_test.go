package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/internal/archive"
	"github.com/relaybus/relaybus/internal/emulator"
	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/ledger"
	"github.com/relaybus/relaybus/internal/ledger/model"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/internal/privacy"
	"github.com/relaybus/relaybus/internal/privacy/topologyrules"
	"github.com/relaybus/relaybus/internal/pubsubtest"
	"github.com/relaybus/relaybus/internal/registry"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/topology"
)

// relaybus erase --subject against the real API: the subject's event is
// erased from the outbox and the ledger, and the answer says so store by
// store; without --subject it is a usage error.
func TestEraseCommand(t *testing.T) {
	ctx := context.Background()
	emutest.Host(t, emulator.Firestore)
	top, err := topology.Load("")
	if err != nil {
		t.Fatal(err)
	}
	for i := range top.Topics {
		if top.Topics[i].Name == "shop.order.events" {
			top.Topics[i].Privacy = topology.Privacy{Fields: []string{"/email"}, Subject: "/customerId"}
		}
	}
	key, _ := privacy.NewKey("cli-erase-test-key-0123")
	store, err := ledger.Open(ctx, ledger.Config{ProjectID: emutest.FirestoreProject(t)}, ledger.Options{Registry: registry.FromTopology(top),
		Privacy: topologyrules.Of(top), PrivacyKey: key})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	pool := pgtest.Schema(t)
	if err := outbox.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	fake := pubsubtest.New(t)
	fake.Provision(t, top)
	ev := &event.Event{ID: "evt-erase-1", Type: "order.purchased", Source: "order-service", Topic: "shop.order.events",
		AggregateID: "order-1", Version: 1, Payload: []byte(`{"customerId":"c-42","email":"c42@example.com"}`)}
	if err := ev.Prepare(time.Now(), event.Limits{}); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Enqueue(ctx, pool, ev); err != nil {
		t.Fatal(err)
	}
	if err := store.RecordSent(ctx, model.SentAt(time.Now(), ev)); err != nil {
		t.Fatal(err)
	}
	h, err := dlqreplay.New(dlqreplay.Options{Archive: archive.New(store.Client()), Ledger: store, DB: pool, Publisher: fake.Client, Topology: top,
		Auth: dlqreplay.AuthToken, Token: `{"ops@example.com": "t0k-0123456789abcdef0123456789abcdef"}`, Audience: "https://relaybus-dlqreplay-test.a.run.app",
		Archivers: []string{"relaybus-dlq-push@relaybus-test.iam.gserviceaccount.com"}, Writers: []string{"ops@example.com"}, RateLimit: -1})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	cli := func(args ...string) (int, string) {
		var out, errOut bytes.Buffer
		code := run(ctx, append([]string{"--api", srv.URL, "--token", "t0k-0123456789abcdef0123456789abcdef"}, args...), &out, &errOut, http.DefaultClient)
		return code, out.String() + errOut.String()
	}
	code, out := cli("erase", "--subject", "c-42")
	if code != 0 || !strings.Contains(out, `{"erased":1,"store":"ledger"}`) || !strings.Contains(out, `{"erased":1,"store":"outbox:main"}`) ||
		!strings.Contains(out, key.SubjectKey("c-42")) {
		t.Errorf("erase: exit %d\n%s", code, out)
	}
	var payload []byte
	if err := pool.QueryRow(ctx, `SELECT payload FROM relaybus_outbox WHERE id = 'evt-erase-1'`).Scan(&payload); err != nil || string(payload) != "null" {
		t.Errorf("outbox payload after erase: %s %v", payload, err)
	}
	if code, out := cli("erase"); code != 2 || !strings.Contains(out, "give --subject") {
		t.Errorf("erase without --subject: exit %d\n%s", code, out)
	}
}
