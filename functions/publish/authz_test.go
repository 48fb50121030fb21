package publish_test

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/relaybus/relaybus/functions/publish"
	"github.com/relaybus/relaybus/shared/registry"
	"github.com/relaybus/relaybus/shared/topology"
)

func registryOf(top *topology.Topology) registry.Registry { return registry.FromTopology(top) }

// idToken is a Google ID token as a service behind Cloud Run IAM receives
// it: verified by the platform, its signature replaced.
func idToken(email string) string {
	enc := func(v any) string {
		b, _ := json.Marshal(v)
		return base64.RawURLEncoding.EncodeToString(b)
	}
	now := time.Now().Unix()
	return enc(map[string]string{"alg": "RS256", "typ": "JWT"}) + "." +
		enc(map[string]any{"iss": "https://accounts.google.com", "aud": "https://relaybus-publish-test.a.run.app", "email": email,
			"email_verified": true, "sub": "1234", "iat": now, "exp": now + 3600}) + ".SIGNATURE_REMOVED_BY_GOOGLE"
}

// Per-topic publish authorization (PUBLISH_AUTH=cloudrun): the topology's
// publishers of a topic are the only callers that may write it, named by
// the ID token Cloud Run verified; anyone else gets 403 naming the topic
// and the caller, and nothing is written. The initiator's service is
// recorded from that identity, not from the body. A topic without
// publishers takes every caller Cloud Run admitted.
func TestPublishIsAuthorizedPerTopic(t *testing.T) {
	top, err := topology.Parse([]byte(testTopology + `
  - name: shop.payment.events
    publishers: [serviceAccount:payment-service@relaybus-test.iam.gserviceaccount.com]
    consumers:
      - service: ledger-service
`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := topology.Parse([]byte(testTopology + `
  - name: shop.payment.events
    publishers: [group:payments@example.com]
`)); err == nil {
		t.Error("a group publisher was accepted; a token cannot be checked against a group")
	}
	h := newHarness(t, func(o *publish.Options) {
		o.Auth = publish.AuthCloudRun
		o.Publishers = map[string][]string{}
		for _, tp := range top.Topics {
			o.Publishers[tp.Name] = tp.PublisherEmails()
		}
		o.Registry = registryOf(top)
	})
	payment := func(id string) []byte {
		return mustJSON(t, envelope(map[string]any{"eventId": id, "topic": "shop.payment.events", "eventType": "payment.captured", "aggregateId": "pay-1",
			"initiator": map[string]any{"service": "someone-else", "userId": "user-7"}}))
	}
	auth := func(email string) []string {
		return []string{"Content-Type", "application/json", "Authorization", "Bearer " + idToken(email)}
	}

	status, body, _ := post(t, h.url, payment("evt-pay-1"), auth("order-service@relaybus-test.iam.gserviceaccount.com")...)
	if status != http.StatusForbidden {
		t.Fatalf("a caller not listed: %d %s, want 403", status, body)
	}
	e := decodeJSON[publish.ErrorResponse](t, body)
	if e.Error != publish.CodeForbidden || e.Topic != "shop.payment.events" || e.Caller != "order-service@relaybus-test.iam.gserviceaccount.com" {
		t.Errorf("403 answer %+v, want forbidden naming the topic and the caller", e)
	}
	// In a batch, one forbidden event refuses all of it.
	batch := mustJSON(t, []map[string]any{envelope(map[string]any{"eventId": "evt-ord-9"}), envelope(map[string]any{"eventId": "evt-pay-9", "topic": "shop.payment.events", "aggregateId": "pay-9"})})
	if status, body, _ := post(t, h.url, batch, auth("order-service@relaybus-test.iam.gserviceaccount.com")...); status != http.StatusForbidden {
		t.Errorf("batch with a forbidden topic: %d %s", status, body)
	}
	if status, body, _ := post(t, h.url, payment("evt-pay-2"), "Content-Type", "application/json"); status != http.StatusUnauthorized {
		t.Errorf("no token: %d %s, want 401", status, body)
	}
	if n := h.rows(t); n != 0 {
		t.Fatalf("refused requests wrote %d rows", n)
	}

	if status, body, _ := post(t, h.url, payment("evt-pay-3"), auth("Payment-Service@relaybus-test.iam.gserviceaccount.com")...); status != http.StatusAccepted {
		t.Fatalf("the listed publisher: %d %s", status, body)
	}
	if got := h.row(t, "evt-pay-3").initiator["service"]; got != "payment-service" {
		t.Errorf("initiator service %q, want payment-service (from the verified identity, not the body's someone-else)", got)
	}
	// A topic without publishers: every admitted caller.
	if status, body, _ := post(t, h.url, mustJSON(t, envelope(map[string]any{"eventId": "evt-ord-1"})), auth("order-service@relaybus-test.iam.gserviceaccount.com")...); status != http.StatusAccepted {
		t.Fatalf("a topic without publishers: %d %s", status, body)
	}
	if _, err := publish.New(publish.Options{DB: h.pool, Registry: registryOf(top), Auth: "token"}); err == nil {
		t.Error("PUBLISH_AUTH=token accepted")
	}
}
