package dlqreplay_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/internal/inbox"
	"github.com/relaybus/relaybus/shared/broker"
	"github.com/relaybus/relaybus/shared/broker/brokertest/natstest"
	"github.com/relaybus/relaybus/shared/broker/nats"
)

// Where forwarders cannot be served, adding one answers 501
// not_configured with what is missing, and nothing is registered: on
// Pub/Sub without the forwarders service (a deployment with
// infra/terraform's forwarders off: no DLQREPLAY_FORWARDERS_URL), and on
// NATS (whose driver cannot create a consumer at run time) even with the
// URL set. Listing answers the (empty) registry either way.
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
		{"NATS", func(t *testing.T, o *dlqreplay.Options) {
			nc, err := nats.Connect(context.Background(), natstest.Server(t), nats.Options{PullWait: 200 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = nc.Close() })
			o.Publisher, o.Broker = nc, nc
			o.Forwarders = dlqreplay.ForwardersOptions{URL: "https://relaybus-forwarders-123.europe-west1.run.app"}
		}, []string{"the broker cannot create subscriptions at run time", "on NATS, declare the forward consumer in the topology"}},
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
