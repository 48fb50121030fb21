package publish_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relaybus/relaybus/functions/publish"
	"github.com/relaybus/relaybus/internal/pubsubtest"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/relay"
)

// A scheduled event, as an envelope field or a CloudEvents extension, is
// accepted as pending with its deliverAt, stored with it, and not
// published by the fast path; an unscheduled one beside it is.
func TestScheduledEventIsAcceptedButNotPublishedAtOnce(t *testing.T) {
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
	when := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	env := envelope(map[string]any{"eventId": "evt-sched", "aggregateId": "order-s", "deliverAt": when.Format(time.RFC3339)})
	status, body, _ := post(t, h.url, mustJSON(t, env), "Content-Type", "application/json")
	res := decodeJSON[publish.Result](t, body)
	if status != http.StatusAccepted || res.Status != publish.StatusPending || !res.DeliverAt.Equal(when) {
		t.Fatalf("scheduled envelope: %d %s, want 202 pending with deliverAt %s", status, body, when)
	}
	status, body, _ = post(t, h.url, []byte(`{"orderId":"order-c"}`), "Content-Type", "application/json",
		"ce-specversion", "1.0", "ce-id", "evt-sched-ce", "ce-type", "order.purchased", "ce-source", "order-service",
		"ce-subject", "order-c", "ce-topic", "shop.order.events", "ce-version", "1", "ce-deliverat", when.Format(time.RFC3339))
	if res := decodeJSON[publish.Result](t, body); status != http.StatusAccepted || res.Status != publish.StatusPending || !res.DeliverAt.Equal(when) {
		t.Fatalf("scheduled CloudEvent: %d %s", status, body)
	}
	env = envelope(map[string]any{"eventId": "evt-now", "aggregateId": "order-n"})
	status, body, _ = post(t, h.url, mustJSON(t, env), "Content-Type", "application/json")
	if res := decodeJSON[publish.Result](t, body); status != http.StatusAccepted || res.Status != publish.StatusPublished {
		t.Fatalf("unscheduled: %d %s", status, body)
	}
	if n := len(fake.Server.Messages()); n != 1 {
		t.Fatalf("Pub/Sub holds %d messages, want the unscheduled one alone", n)
	}
	got, err := outbox.Lookup(context.Background(), h.pool, "evt-sched", "evt-sched-ce")
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"evt-sched", "evt-sched-ce"} {
		if got[id].State != outbox.StatePending || !got[id].DeliverAt.Equal(when) {
			t.Errorf("%s in the outbox: %+v", id, got[id])
		}
	}
}
