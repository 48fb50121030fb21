package publish_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/relaybus/relaybus/functions/publish"
	"github.com/relaybus/relaybus/internal/idtokentest"
	"github.com/relaybus/relaybus/internal/registry"
	"github.com/relaybus/relaybus/shared/topology"
)

func registryOf(top *topology.Topology) registry.Registry { return registry.FromTopology(top) }

// testAudience is the publish service's URL, the audience of its callers'
// ID tokens.
const testAudience = "https://relaybus-publish-test.a.run.app"

// idToken is a Google ID token as a service behind Cloud Run IAM receives
// it: verified by the platform, its signature replaced.
func idToken(email string) string {
	return idtokentest.Stripped(idtokentest.Claims(email, testAudience))
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
		o.Auth, o.OnCloudRun, o.Audiences = publish.AuthCloudRun, true, []string{testAudience}
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
	// A topic without publishers takes nobody (closed by default).
	status, body, _ = post(t, h.url, mustJSON(t, envelope(map[string]any{"eventId": "evt-ord-1"})), auth("order-service@relaybus-test.iam.gserviceaccount.com")...)
	if status != http.StatusForbidden || !strings.Contains(string(body), "declares no publishers") {
		t.Fatalf("a topic without publishers: %d %s, want 403 saying it declares none", status, body)
	}
	// Cloud Run checked the token, and so does publish: an expired one, or
	// one minted for another service, is refused.
	for name, claims := range map[string]map[string]any{
		"expired": func() map[string]any {
			c := idtokentest.Claims("payment-service@relaybus-test.iam.gserviceaccount.com", testAudience)
			c["exp"] = time.Now().Add(-time.Hour).Unix()
			return c
		}(),
		"another audience": idtokentest.Claims("payment-service@relaybus-test.iam.gserviceaccount.com", "https://other.a.run.app"),
	} {
		status, body, _ := post(t, h.url, payment("evt-pay-"+name), "Content-Type", "application/json", "Authorization", "Bearer "+idtokentest.Stripped(claims))
		if status != http.StatusUnauthorized {
			t.Errorf("%s token: %d %s, want 401", name, status, body)
		}
	}
	if _, err := publish.New(publish.Options{DB: h.pool, Registry: registryOf(top), Auth: "token"}); err == nil {
		t.Error("PUBLISH_AUTH=token accepted")
	}
	// cloudrun mode trusts claims only Cloud Run's IAM verified: off Cloud
	// Run it does not start.
	if _, err := publish.New(publish.Options{DB: h.pool, Registry: registryOf(top), Auth: publish.AuthCloudRun}); err == nil || !strings.Contains(err.Error(), "K_SERVICE") {
		t.Errorf("PUBLISH_AUTH=cloudrun off Cloud Run: %v, want refused", err)
	}
}

// PUBLISH_PUBLISHERS adds a deployment's publishers to the topology's;
// groups are refused (a token does not name its holder's groups).
func TestParsePublishers(t *testing.T) {
	got, err := publish.ParsePublishers(`{"shop.order.events": ["serviceAccount:order@p.iam.gserviceaccount.com", "alice@example.com"]}`)
	if err != nil || len(got["shop.order.events"]) != 2 {
		t.Fatalf("%v, %v", got, err)
	}
	for _, bad := range []string{`[]`, `{"Shop": ["a@b.c"]}`, `{"shop.order.events": ["group:ops@example.com"]}`, `{"shop.order.events": ["nobody"]}`} {
		if _, err := publish.ParsePublishers(bad); err == nil || !strings.Contains(err.Error(), "PUBLISH_PUBLISHERS") {
			t.Errorf("%s: %v, want an error naming PUBLISH_PUBLISHERS", bad, err)
		}
	}
}

// Each caller has its own request budget: past it, 429 with Retry-After
// and nothing written, while another caller goes on.
func TestPublishLimitsEachCaller(t *testing.T) {
	h := newHarness(t, func(o *publish.Options) {
		o.Auth, o.OnCloudRun = publish.AuthCloudRun, true
		o.Publishers = map[string][]string{"shop.order.events": {"a@p.iam.gserviceaccount.com", "b@p.iam.gserviceaccount.com"}}
		o.RateLimit, o.RateBurst = 0.001, 2
	})
	as := func(email string) []string {
		return []string{"Content-Type", "application/json", "Authorization", "Bearer " + idToken(email)}
	}
	for i := range 2 {
		if status, body, _ := post(t, h.url, mustJSON(t, envelope(map[string]any{"eventId": fmt.Sprintf("rl-a-%d", i), "version": i + 1})), as("a@p.iam.gserviceaccount.com")...); status != http.StatusAccepted {
			t.Fatalf("request %d within the burst: %d %s", i+1, status, body)
		}
	}
	status, body, hdr := post(t, h.url, mustJSON(t, envelope(map[string]any{"eventId": "rl-a-2", "version": 3})), as("a@p.iam.gserviceaccount.com")...)
	if status != http.StatusTooManyRequests || hdr.Get("Retry-After") == "" {
		t.Fatalf("past the burst: %d (Retry-After %q) %s, want 429 with Retry-After", status, hdr.Get("Retry-After"), body)
	}
	if e := decodeJSON[publish.ErrorResponse](t, body); e.Error != publish.CodeRateLimited || e.Caller != "a@p.iam.gserviceaccount.com" {
		t.Errorf("429 answer %+v", e)
	}
	if status, body, _ := post(t, h.url, mustJSON(t, envelope(map[string]any{"eventId": "rl-b-0", "aggregateId": "order-b"})), as("b@p.iam.gserviceaccount.com")...); status != http.StatusAccepted {
		t.Fatalf("another caller: %d %s", status, body)
	}
	if n := h.rows(t); n != 3 {
		t.Errorf("%d rows, want 3 (the refused request wrote nothing)", n)
	}
}

// The squatting a security review reproduced, replayed over the real
// handler and Postgres: a producer allowed only on member.points.events
// (1) publishes aggregateType=order, aggregateId=order-42, v1 on its own
// topic, which took the real order-42's version 1 (every later order-42 v1
// answered 409 for good), and (2) takes the eventId the order service is
// about to use, which made the order service's publish answer 202
// duplicate:true, nothing written, naming the squatter's topic. Now (1) is
// refused (order is shop.order.events's aggregate type) and (2) answers
// the order service 409 event_id_conflict without a word of the other
// event; the real order-42 v1 goes through under a fresh id.
func TestPublishCannotSquatAnotherTopicsAggregatesOrIDs(t *testing.T) {
	top, err := topology.Parse([]byte(`
rollup: {topic: relaybus.ledger.rollup}
topics:
  - name: shop.order.events
    publishers: [serviceAccount:order-service@relaybus-test.iam.gserviceaccount.com]
    consumers: [{service: member-service}]
  - name: member.points.events
    publishers: [serviceAccount:points-service@relaybus-test.iam.gserviceaccount.com]
    aggregate_types: [member]
    consumers: [{service: audit-service}]
`))
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(o *publish.Options) {
		o.Auth, o.OnCloudRun, o.Topology, o.Registry = publish.AuthCloudRun, true, top, registryOf(top)
		o.Publishers = map[string][]string{}
		for _, tp := range top.Topics {
			o.Publishers[tp.Name] = tp.PublisherEmails()
		}
	})
	as := func(sa string) []string {
		return []string{"Content-Type", "application/json", "Authorization", "Bearer " + idToken(sa+"@relaybus-test.iam.gserviceaccount.com")}
	}
	points := func(over map[string]any) []byte {
		m := envelope(map[string]any{"topic": "member.points.events", "eventType": "points.added", "aggregateType": "member", "aggregateId": "member-7"})
		for k, v := range over {
			m[k] = v
		}
		return mustJSON(t, m)
	}
	order := func(id string) []byte {
		return mustJSON(t, envelope(map[string]any{"eventId": id, "aggregateType": "order", "aggregateId": "order-42", "version": 1}))
	}

	// The squatter's own topic is allowed, another's is not.
	if status, body, _ := post(t, h.url, order("order-42-by-points"), as("points-service")...); status != http.StatusForbidden {
		t.Fatalf("points-service on shop.order.events: %d %s, want 403", status, body)
	}
	// (1) order-42 v1 on its own topic: refused, nothing written.
	status, body, _ := post(t, h.url, points(map[string]any{"eventId": "squat-1", "aggregateType": "order", "aggregateId": "order-42", "version": 1}), as("points-service")...)
	if status != http.StatusBadRequest {
		t.Fatalf("order-42 v1 published on member.points.events: %d %s, want 400", status, body)
	}
	if e := decodeJSON[publish.ErrorResponse](t, body); len(e.Fields) != 1 || e.Fields[0].Field != "aggregateType" || !strings.Contains(e.Fields[0].Rule, "(member)") {
		t.Errorf("answer %+v, want aggregateType naming what member.points.events carries", e)
	}
	// (2) A points event under the id the order service will use: its own
	// event on its own topic, so it is accepted.
	if status, body, _ := post(t, h.url, points(map[string]any{"eventId": "order-42-created"}), as("points-service")...); status != http.StatusAccepted {
		t.Fatalf("points-service's own event: %d %s", status, body)
	}

	// The order service publishes the real order-42 v1 under that id: a
	// conflict it hears of, not a duplicate, and nothing of the points
	// event in the answer.
	status, body, _ = post(t, h.url, order("order-42-created"), as("order-service")...)
	if status != http.StatusConflict {
		t.Fatalf("the real order-42 under a taken id: %d %s, want 409", status, body)
	}
	e := decodeJSON[publish.ErrorResponse](t, body)
	if e.Error != publish.CodeEventIDConflict || len(e.Fields) != 1 || e.Fields[0].Field != "eventId" {
		t.Errorf("answer %+v, want event_id_conflict on eventId", e)
	}
	for _, leak := range []string{"member.points.events", "member-7", "points.added", "relaybus_outbox", "Key ("} {
		if strings.Contains(string(body), leak) {
			t.Errorf("the answer reveals %q: %s", leak, body)
		}
	}
	// Under a fresh id, order-42 v1 is the order service's to publish.
	status, body, _ = post(t, h.url, order("order-42-created-2"), as("order-service")...)
	if status != http.StatusAccepted {
		t.Fatalf("the real order-42 v1 under a fresh id: %d %s, want 202", status, body)
	}
	if r := decodeJSON[publish.Result](t, body); r.Duplicate || r.Topic != "shop.order.events" {
		t.Errorf("result %+v", r)
	}
	if r := h.row(t, "order-42-created"); r.topic != "member.points.events" {
		t.Errorf("the points event was overwritten: %+v", r)
	}
	if n := h.rows(t); n != 2 {
		t.Errorf("%d rows, want 2 (the points event and the real order-42 v1)", n)
	}
}
