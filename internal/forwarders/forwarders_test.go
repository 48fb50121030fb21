package forwarders

import (
	"strings"
	"testing"

	"github.com/relaybus/relaybus/shared/topology"
)

// Check names each broken field with its rule, and accepts what is valid.
func TestCheck(t *testing.T) {
	top, err := topology.Load("")
	if err != nil {
		t.Fatal(err)
	}
	ok := Forwarder{Name: "crm-webhook", Topic: "shop.order.events", URL: "https://crm.example.com/hook"}
	for _, c := range []struct {
		name   string
		change func(*Forwarder)
		field  string // "" valid
		rule   string
	}{
		{"valid", func(*Forwarder) {}, "", ""},
		{"google over https", func(f *Forwarder) { f.Auth, f.Audience = "google", "https://crm.example.com" }, "", ""},
		{"google over http to loopback", func(f *Forwarder) { f.Auth, f.URL = "google", "http://127.0.0.1:9000/hook" }, "", ""},
		{"a filter", func(f *Forwarder) { f.Filter = `attributes.event_type = "order.purchased"` }, "", ""},
		{"empty name", func(f *Forwarder) { f.Name = "" }, "name", "a consumer service is"},
		{"declared name", func(f *Forwarder) { f.Name = "message-service" }, "name", "declares"},
		{"unknown topic", func(f *Forwarder) { f.Topic = "shop.cart.events" }, "topic", "declares no topic"},
		{"bad topic", func(f *Forwarder) { f.Topic = "Shop" }, "topic", "a topic is"},
		{"relative URL", func(f *Forwarder) { f.URL = "/hook" }, "url", "absolute http(s)"},
		{"long URL", func(f *Forwarder) { f.URL = "https://x.example.com/" + strings.Repeat("a", MaxURL) }, "url", "at most"},
		{"password", func(f *Forwarder) { f.URL = "https://a:b@x.example.com" }, "url", "user or password"},
		{"query", func(f *Forwarder) { f.URL = "https://x.example.com/?k=v" }, "url", "query"},
		{"google over http", func(f *Forwarder) { f.Auth, f.URL = "google", "http://x.example.com" }, "url", "https"},
		{"hmac over https", func(f *Forwarder) { f.Auth = "hmac" }, "", ""},
		{"hmac over http to loopback", func(f *Forwarder) { f.Auth, f.URL = "hmac", "http://localhost:9000/hook" }, "", ""},
		{"hmac over http", func(f *Forwarder) { f.Auth, f.URL = "hmac", "http://x.example.com/hook" }, "url", "must be https with auth hmac: the requests carry a signature"},
		{"unknown auth", func(f *Forwarder) { f.Auth = "basic" }, "auth", "none, google or hmac"},
		{"unknown auth over http", func(f *Forwarder) { f.Auth, f.URL = "basic", "http://x.example.com/hook" }, "auth", "none, google or hmac"},
		{"audience without google", func(f *Forwarder) { f.Audience = "x" }, "audience", "only auth google"},
		{"long filter", func(f *Forwarder) { f.Filter = strings.Repeat("x", MaxFilter) }, "filter", "at most 256"},
		{"in flight", func(f *Forwarder) { f.MaxInFlight = -1 }, "maxInFlight", "from 0"},
		{"rate", func(f *Forwarder) { f.MaxPerSecond = MaxPerSecondCap + 1 }, "maxPerSecond", "from 0"},
		{"timeout", func(f *Forwarder) { f.TimeoutSeconds = top.Defaults.AckDeadlineSeconds }, "timeoutSeconds", "ack deadline"},
		{"description", func(f *Forwarder) { f.Description = strings.Repeat("d", MaxDescription+1) }, "description", "at most"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := ok
			c.change(&f)
			bad := f.Check(top)
			if c.field == "" {
				if len(bad) != 0 {
					t.Fatalf("refused: %v", bad[0])
				}
				if f.Auth == "" {
					t.Fatal("Check left Auth empty; want none")
				}
				return
			}
			if len(bad) != 1 || bad[0].Field != c.field || !strings.Contains(bad[0].Rule, c.rule) {
				for _, b := range bad {
					t.Logf("%s: %s", b.Field, b.Rule)
				}
				t.Fatalf("want one refusal of %s saying %q", c.field, c.rule)
			}
		})
	}
	if got := ok.Subscription(); got != "shop.order.events.crm-webhook-forwarder" {
		t.Errorf("Subscription() = %s", got)
	}
}
