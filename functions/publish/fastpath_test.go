package publish_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relaybus/relaybus/functions/publish"
	"github.com/relaybus/relaybus/internal/pubsubtest"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/relay"
)

// newFastPath is the real relay over the test's outbox and pstest.
func newFastPath(tb testing.TB, pool *pgxpool.Pool, fake *pubsubtest.Fake) publish.FastPath {
	tb.Helper()
	r, err := relay.New(relay.Options{DB: pool, Publisher: fake.Client, Topology: loadTopology(tb)})
	if err != nil {
		tb.Fatal(err)
	}
	return r
}

// With the relay's fast path, an accepted event is on Pub/Sub when the
// answer comes: 202 with status published; a later version waits behind an
// earlier one that is still pending, and the answer says pending.
func TestFastPathPublishesAtOnceAndKeepsOrder(t *testing.T) {
	var fake *pubsubtest.Fake
	h := newHarness(t, func(o *publish.Options) {
		fake = pubsubtest.New(t)
		fake.Provision(t, loadTopology(t))
		r, err := relay.New(relay.Options{DB: o.DB.(*pgxpool.Pool), Publisher: fake.Client, Topology: loadTopology(t)})
		if err != nil {
			t.Fatal(err)
		}
		o.FastPath = r
	})
	send := func(id string, version int) publish.Result {
		env := envelope(map[string]any{"eventId": id, "aggregateId": "order-7", "version": version})
		status, body, _ := post(t, h.url, mustJSON(t, env), "Content-Type", "application/json")
		if status != http.StatusAccepted {
			t.Fatalf("%s: status %d: %s", id, status, body)
		}
		return decodeJSON[publish.Result](t, body)
	}
	if res := send("evt-v1", 1); res.Status != publish.StatusPublished {
		t.Fatalf("v1: %+v, want published at once", res)
	}
	if n := len(fake.Server.Messages()); n != 1 {
		t.Fatalf("Pub/Sub holds %d messages after the 202, want 1", n)
	}
	// Another relay holds order-8's v1: its v2 must wait behind it.
	ctx := context.Background()
	if _, err := outbox.Enqueue(ctx, h.pool, &event.Event{ID: "evt-8-v1", Type: "order.purchased", Source: "order-service",
		Topic: "shop.order.events", AggregateID: "order-8", Version: 1, Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Claim(ctx, h.pool, outbox.ClaimOptions{Owner: "other-relay", Lease: time.Minute, Limit: 10,
		Aggregates: [][2]string{{"order", "order-8"}}}); err != nil {
		t.Fatal(err)
	}
	env := envelope(map[string]any{"eventId": "evt-8-v2", "aggregateId": "order-8", "version": 2})
	status, body, _ := post(t, h.url, mustJSON(t, env), "Content-Type", "application/json")
	if res := decodeJSON[publish.Result](t, body); status != http.StatusAccepted || res.Status != publish.StatusPending {
		t.Errorf("v2 behind a v1 another relay holds: %d %+v, want 202 pending", status, res)
	}
	if n := len(fake.Server.Messages()); n != 1 {
		t.Errorf("Pub/Sub holds %d messages, want only order-7's", n)
	}
	if res := send("evt-v2", 2); res.Status != publish.StatusPublished {
		t.Errorf("order-7 v2: %+v, want published", res)
	}
}
