package publish

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
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
	"github.com/relaybus/relaybus/internal/registry"
	"github.com/relaybus/relaybus/shared/broker/pubsub"
	"github.com/relaybus/relaybus/shared/topology"
)

// The registered function builds itself from the environment: outbox,
// topology registry (LEDGER=off) and the fast path to the Pub/Sub emulator.
func TestServeFromEnvironment(t *testing.T) {
	emutest.Host(t, emulator.PubSub) // make test's, or one started for the test binary
	_, schema := pgtest.SchemaConfig(t, nil)
	project := fmt.Sprintf("publish-env-%d", time.Now().UnixNano())
	top, err := topology.Load("")
	if err != nil {
		t.Fatal(err)
	}
	ps, err := pubsub.New(context.Background(), project, pubsub.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ps.Close()
	if err := ps.Provision(context.Background(), top); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GOOGLE_CLOUD_PROJECT", project)
	t.Setenv("DATABASE_URL", pgtest.SchemaURL(t, schema))
	t.Setenv("LEDGER", "off")
	srv := httptest.NewServer(instance.Lazy("publish", instance.FromEnv(instance.Load[Config], Build)))
	defer srv.Close()
	body := `{"eventType":"order.purchased","topic":"shop.order.events","aggregateId":"order-1","version":1,"source":"order-service","payload":{"n":1}}`
	resp, err := http.Post(srv.URL, "application/json", bytes.NewReader([]byte(body)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var res Result
	_ = json.NewDecoder(resp.Body).Decode(&res)
	if resp.StatusCode != http.StatusAccepted || res.Status != StatusPublished {
		t.Fatalf("env-built publish: %d %+v, want 202 published", resp.StatusCode, res)
	}
}

// With the production default LEDGER=firestore (the emulator): the topic
// registry comes from the ledger's topic_consumers, and the SENT record is
// written after the answer, in the background.
func TestServeFromEnvironmentWithTheLedger(t *testing.T) {
	emutest.Host(t, emulator.PubSub) // make test's, or one started for the test binary
	ctx := context.Background()
	_, schema := pgtest.SchemaConfig(t, nil)
	project := emutest.FirestoreProject(t)
	top, err := topology.Load("")
	if err != nil {
		t.Fatal(err)
	}
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
	srv := httptest.NewServer(instance.Lazy("publish", instance.FromEnv(instance.Load[Config], Build)))
	defer srv.Close()
	body := `{"eventType":"order.purchased","topic":"shop.order.events","aggregateId":"order-1","version":1,"source":"order-service","payload":{"n":1}}`
	resp, err := http.Post(srv.URL, "application/json", bytes.NewReader([]byte(body)))
	if err != nil {
		t.Fatal(err)
	}
	var res Result
	_ = json.NewDecoder(resp.Body).Decode(&res)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted || res.Status != StatusPublished {
		t.Fatalf("env-built publish: %d %+v, want 202 published", resp.StatusCode, res)
	}
	eventually.True(t, 20*time.Second, "the ledger recording the send (SENT, 2 expected consumers, enqueuedAt)", func() bool {
		d, err := query.New(store.Client()).Get(ctx, res.EventID)
		return err == nil && d.Event.Status == model.StatusSent && len(d.Event.ExpectedConsumers) == 2 && !d.Event.EnqueuedAt.IsZero()
	})
}
