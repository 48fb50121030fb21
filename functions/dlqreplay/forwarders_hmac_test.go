package dlqreplay_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/delivery"
	"github.com/relaybus/relaybus/internal/forwarders"
	"github.com/relaybus/relaybus/internal/pubsubtest"
	"github.com/relaybus/relaybus/shared/forward"
)

// An hmac forwarder added through the API signs every request with the
// secret the add answered, the one time it is shown: the target verifies
// each with it (the Standard Webhooks check users write); no listing, no
// audit entry and no stored row holds it. A rotation answers a new secret
// that signs from then on, the previous one beside it for
// forwarders.RotationOverlap; once that has passed, the old secret no
// longer verifies anything.
func TestAnHMACForwarderSignsWithTheSecretTheAPIAnswersOnce(t *testing.T) {
	ctx := context.Background()
	s := newForwardersStack(t)
	hook := newWebhook(t)

	a := s.do(t, "POST", "/forwarders", map[string]any{"name": "crm-webhook", "topic": "shop.order.events", "url": hook.url, "auth": "hmac"})
	if a.status != 200 {
		t.Fatalf("add: %d %s", a.status, a.raw)
	}
	first := secretOf(t, a.body)
	fv := a.body["forwarder"].(map[string]any)
	if fv["auth"] != "hmac" {
		t.Fatalf("added: %v", fv)
	}
	s.deliver(t, fmt.Sprint(fv["subscription"]), "shop.order.events", fmt.Sprint(fv["pushEndpoint"]))

	// Shown once: not in the listing, the forwarder, the audit log, nor
	// the database's row (the secret's key bytes in any form).
	key := strings.TrimPrefix(first, forward.SecretPrefix)
	for _, path := range []string{"/forwarders", "/forwarders/crm-webhook", "/audit?action=forwarder."} {
		if r := s.do(t, "GET", path, nil); r.status != 200 || strings.Contains(r.raw, key) || strings.Contains(r.raw, "signingSecret") {
			t.Errorf("GET %s: %d shows the secret: %s", path, r.status, r.raw)
		}
	}
	var row string
	if err := s.db.QueryRow(ctx, `SELECT t::text FROM relaybus_inbox_forwarders t WHERE name = 'crm-webhook'`).Scan(&row); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(row, key) || !strings.Contains(row, "v1:") {
		t.Fatalf("the stored row holds the secret, or no sealed value: %s", row)
	}

	// Every request verifies with the secret answered, one signature each.
	ids := s.publish(t, "order-9", 1, 2)
	if got := hook.wait(t, len(ids)); strings.Join(got, ",") != strings.Join(ids, ",") {
		t.Fatalf("received %v, want %v", got, ids)
	}
	for _, r := range hook.last(len(ids)) {
		if err := forward.Verify(first, r.header, r.body, time.Now(), 0); err != nil {
			t.Fatalf("request %s does not verify with the secret the API answered: %v", r.header.Get("Webhook-Id"), err)
		}
		if n := len(strings.Fields(r.header.Get(forward.HeaderWebhookSig))); n != 1 {
			t.Fatalf("%d signatures, want 1: %s", n, r.header.Get(forward.HeaderWebhookSig))
		}
	}

	// Rotated: a new secret, answered once; both sign during the overlap.
	rot := s.do(t, "PATCH", "/forwarders/crm-webhook", map[string]any{"rotateSecret": true})
	if rot.status != 200 || rot.body["changed"] != true {
		t.Fatalf("rotate: %d %s", rot.status, rot.raw)
	}
	second := secretOf(t, rot.body)
	until, err := time.Parse(time.RFC3339, fmt.Sprint(rot.body["signingSecret"].(map[string]any)["previousUntil"]))
	if err != nil || second == first || time.Until(until) < forwarders.RotationOverlap-time.Minute {
		t.Fatalf("rotated to %q (the first was %q), the previous signing until %v (%v)", second, first, until, err)
	}
	if r := s.do(t, "GET", "/forwarders/crm-webhook", nil); r.status != 200 || strings.Contains(r.raw, strings.TrimPrefix(second, forward.SecretPrefix)) ||
		r.body["forwarder"].(map[string]any)["previousSecretUntil"] == nil {
		t.Fatalf("GET after the rotation: %d %s", r.status, r.raw)
	}
	next := s.publish(t, "order-9", 3, 3)
	hook.wait(t, len(next))
	r := hook.last(1)[0]
	for _, sec := range []string{second, first} {
		if err := forward.Verify(sec, r.header, r.body, time.Now(), 0); err != nil {
			t.Fatalf("during the overlap a request does not verify with %s: %v", sec[:10], err)
		}
	}

	// Rotated again by an API whose clock is a day and an hour behind:
	// the overlap of this rotation is already over, so the new secret
	// signs alone and the ones before no longer verify.
	s.skew.Store(int64(-(forwarders.RotationOverlap + time.Hour)))
	third := secretOf(t, s.do(t, "PATCH", "/forwarders/crm-webhook", map[string]any{"rotateSecret": true}).body)
	last := s.publish(t, "order-9", 4, 4)
	hook.wait(t, len(last))
	r = hook.last(1)[0]
	if err := forward.Verify(third, r.header, r.body, time.Now(), 0); err != nil {
		t.Fatalf("after the rotation the new secret does not verify: %v", err)
	}
	for _, sec := range []string{first, second} {
		if err := forward.Verify(sec, r.header, r.body, time.Now(), 0); !errors.Is(err, forward.ErrSignature) {
			t.Fatalf("after the overlap an old secret still verifies (%v); signatures %s", err, r.header.Get(forward.HeaderWebhookSig))
		}
	}

	// A forwarders service without the key that sealed the secret cannot
	// sign: it answers 503 (Pub/Sub redelivers) and sends nothing.
	before := hook.count()
	sub := "projects/" + pubsubtest.Project + "/subscriptions/" + fmt.Sprint(fv["subscription"])
	for _, key := range []string{forwarders.NewKey(), ""} {
		srv := httptest.NewServer(s.forwardersService(t, key))
		resp, err := http.Post(srv.URL+"/crm-webhook", "application/json", bytes.NewReader(delivery.WrappedBody(s.publishMessage(t, "order-9", 5), sub, 1)))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		srv.Close()
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("a forwarders service with key %q answered %d, want 503", key, resp.StatusCode)
		}
	}
	if n := hook.count(); n != before {
		t.Fatalf("the target received %d requests from the services without the key", n-before)
	}

	// Only hmac has a secret to rotate; leaving hmac drops it.
	if a := s.do(t, "PATCH", "/forwarders/crm-webhook", map[string]any{"auth": "none", "rotateSecret": true}); a.status != 400 || !strings.Contains(a.raw, "rotateSecret") {
		t.Fatalf("rotating without hmac: %d %s, want 400 naming rotateSecret", a.status, a.raw)
	}
	if a := s.do(t, "PATCH", "/forwarders/crm-webhook", map[string]any{"auth": "none"}); a.status != 200 || a.body["signingSecret"] != nil {
		t.Fatalf("auth none: %d %s", a.status, a.raw)
	}
	if err := s.db.QueryRow(ctx, `SELECT signing_secret || previous_signing_secret FROM relaybus_inbox_forwarders WHERE name = 'crm-webhook'`).Scan(&row); err != nil || row != "" {
		t.Fatalf("after auth none the row keeps a sealed secret: %q %v", row, err)
	}
}

// secretOf reads an answer's signing secret.
func secretOf(t *testing.T, body map[string]any) string {
	t.Helper()
	s, _ := body["signingSecret"].(map[string]any)
	secret, _ := s["secret"].(string)
	if _, err := forward.ParseSecret(secret); err != nil || !strings.HasPrefix(secret, forward.SecretPrefix) {
		t.Fatalf("the answer's signing secret %q: %v (answer %v)", secret, err, body)
	}
	return secret
}
