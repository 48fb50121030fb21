package dlqreplay_test

import (
	"context"
	"strings"
	"testing"

	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/internal/inbox"
	"github.com/relaybus/relaybus/shared/broker"
)

// Where forwarders cannot be served, adding one answers 501
// not_configured with what is missing, and nothing is registered: on
// Pub/Sub without the forwarders service (a deployment with
// infra/terraform's forwarders off: no DLQREPLAY_FORWARDERS_URL). Listing
// answers the (empty) registry. (On NATS the API creates a durable
// consumer: forwarders_nats_test.go.)
func TestAddingAForwarderWhereNoneCanBeServedAnswers501(t *testing.T) {
	add := map[string]any{"name": "crm-webhook", "topic": "shop.order.events", "url": "https://crm.example.com/hooks/orders"}
	for _, c := range []struct {
		name string
		opt  func(t *testing.T, o *dlqreplay.Options)
		want []string
	}{
		{"Pub/Sub without the forwarders service", func(t *testing.T, o *dlqreplay.Options) {
			o.Broker = o.Publisher.(broker.Broker)
		}, []string{"DLQREPLAY_FORWARDERS_URL", "forwarders = { enabled = true }"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnvWith(t, func(o *dlqreplay.Options) { o.Auth = dlqreplay.AuthNone; c.opt(t, o) })
			if err := inbox.Migrate(context.Background(), e.db); err != nil {
				t.Fatal(err)
			}
			a := e.do(t, "POST", "/forwarders", add)
			if a.status != 501 || a.body["code"] != "not_configured" {
				t.Fatalf("add: %d %s, want 501 not_configured", a.status, a.raw)
			}
			for _, w := range c.want {
				if !strings.Contains(a.raw, w) {
					t.Errorf("add: %s, want it to say %q", a.raw, w)
				}
			}
			var list map[string]any
			if code := e.call(t, "GET", "/forwarders", nil, &list); code != 200 || len(list["forwarders"].([]any)) != 0 {
				t.Errorf("list after the refusal: %d %v, want 200 and none", code, list)
			}
		})
	}
}
