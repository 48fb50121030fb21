package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/emulator"
	"github.com/relaybus/relaybus/internal/eventually"
	"github.com/relaybus/relaybus/internal/ledger/consumers"
	"github.com/relaybus/relaybus/internal/ledger/model"
	"github.com/relaybus/relaybus/internal/ledger/query"

	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/internal/ledger"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/internal/pubsubtest"
	"github.com/relaybus/relaybus/internal/registry"
	"github.com/relaybus/relaybus/shared/broker/pubsub"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/postgres"
	"github.com/relaybus/relaybus/shared/relay"
	"github.com/relaybus/relaybus/shared/topology"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func enqueue(t *testing.T, db postgres.DBTX, n int) {
	t.Helper()
	for i := range n {
		e := &event.Event{Type: "order.purchased", Source: "order-service", Topic: "shop.order.events",
			AggregateID: fmt.Sprintf("order-%d", i), Version: 1, Payload: []byte(`{}`)}
		if _, err := outbox.Enqueue(context.Background(), db, e); err != nil {
			t.Fatal(err)
		}
	}
}

func post(t *testing.T, url string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Post(url, "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode, body
}

func TestDrainOverHTTP(t *testing.T) {
	pool := pgtest.Schema(t)
	if err := outbox.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	fake := pubsubtest.New(t)
	top, _ := topology.Load("")
	fake.Provision(t, top)
	r, err := relay.New(relay.Options{DB: pool, Publisher: fake.Client, Topology: top})
	if err != nil {
		t.Fatal(err)
	}
	h, err := New(map[string]Drainer{"main": r}, 10*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/relay/", http.StripPrefix("/relay", h))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	enqueue(t, pool, 3)
	code, body := post(t, srv.URL+"/relay/")
	if code != http.StatusOK || body["published"] != float64(3) || body["remaining"] != float64(0) {
		t.Fatalf("POST: %d %v; want 200 with 3 published and none remaining", code, body)
	}
	if code, body := post(t, srv.URL+"/relay/?database=nope"); code != http.StatusBadRequest || !strings.Contains(fmt.Sprint(body["error"]), "database: one of main") {
		t.Errorf("unknown database: %d %v", code, body)
	}
	resp, err := http.Get(srv.URL + "/relay/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "POST" {
		t.Errorf("GET: %d, Allow %q", resp.StatusCode, resp.Header.Get("Allow"))
	}
	pool.Close() // the database goes away: the drain fails and says so
	code, body = post(t, srv.URL+"/relay/")
	if code != http.StatusInternalServerError || body["error"] == "" || strings.Contains(fmt.Sprint(body["error"]), "postgres") {
		t.Errorf("drain without a database: %d %v (the error must say so without the database's details)", code, body)
	}
}

// The registered function builds itself from the environment, against the
// Pub/Sub emulator.
func TestServeFromEnvironment(t *testing.T) {
	emutest.Host(t, emulator.PubSub) // make test's, or one started for the test binary
	pool, schema := pgtest.SchemaConfig(t, nil)
	url := pgtest.SchemaURL(t, schema)
	if err := outbox.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	project := fmt.Sprintf("relay-env-%d", time.Now().UnixNano())
	top, _ := topology.Load("")
	ps, err := pubsub.New(context.Background(), project, pubsub.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ps.Close()
	if err := ps.Provision(context.Background(), top); err != nil {
		t.Fatal(err)
	}
	// A second outbox database: member-service's own (the topology's
	// "member"), here another schema.
	memberPool, memberSchema := pgtest.SchemaConfig(t, nil)
	if err := outbox.Migrate(context.Background(), memberPool); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GOOGLE_CLOUD_PROJECT", project)
	t.Setenv("DATABASE_URL", url)
	t.Setenv("DATABASE_URL_MEMBER", pgtest.SchemaURL(t, memberSchema))
	t.Setenv("RELAY_DATABASES", "main,member")
	t.Setenv("LEDGER", "off")
	enqueue(t, pool, 2)
	enqueue(t, memberPool, 3)
	srv := httptest.NewServer(instance.Lazy("relay", instance.FromEnv(LoadConfig, Build)))
	defer srv.Close()
	code, body := post(t, srv.URL+"?database=member")
	if code != http.StatusOK || body["published"] != float64(3) {
		t.Fatalf("env-built relay, member's database: %d %v", code, body)
	}
	code, body = post(t, srv.URL)
	dbs, _ := body["databases"].(map[string]any)
	if code != http.StatusOK || body["published"] != float64(2) || len(dbs) != 2 {
		t.Fatalf("env-built relay, every database: %d %v", code, body)
	}
	for _, c := range []postgres.DBTX{pool, memberPool} {
		if n, err := outbox.Count(context.Background(), c); err != nil || n.Pending != 0 {
			t.Errorf("a database still holds %+v (%v)", n, err)
		}
	}
}

// With the production default LEDGER=firestore (the emulator): the drain
// publishes, and the ledger records each send right after.
func TestServeFromEnvironmentWithTheLedger(t *testing.T) {
	emutest.Host(t, emulator.PubSub) // make test's, or one started for the test binary
	ctx := context.Background()
	pool, schema := pgtest.SchemaConfig(t, nil)
	if err := outbox.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	project := emutest.FirestoreProject(t)
	top, _ := topology.Load("")
	ps, err := pubsub.New(ctx, project, pubsub.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ps.Close()
	if err := ps.Provision(ctx, top); err != nil {
		t.Fatal(err)
	}
	store, err := ledger.Open(ctx, ledger.Config{ProjectID: project}, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if _, err := consumers.New(store.Client(), consumers.Options{}).SyncConsumers(ctx, registry.Consumers(top), consumers.SyncOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GOOGLE_CLOUD_PROJECT", project)
	t.Setenv("DATABASE_URL", pgtest.SchemaURL(t, schema))
	enqueue(t, pool, 2)
	srv := httptest.NewServer(instance.Lazy("relay", instance.FromEnv(LoadConfig, Build)))
	defer srv.Close()
	if code, body := post(t, srv.URL); code != http.StatusOK || body["published"] != float64(2) {
		t.Fatalf("env-built relay: %d %v", code, body)
	}
	var id string
	if err := pool.QueryRow(ctx, `SELECT id FROM relaybus_outbox LIMIT 1`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, 20*time.Second, "the ledger recording the send of "+id, func() bool {
		d, err := query.New(store.Client()).Get(ctx, id)
		return err == nil && d.Event.Status == model.StatusSent
	})
}
