package topology

import (
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// eventarcSubscription is the name Terraform reads from
// google_eventarc_trigger.transport[0].pubsub[0].subscription: the trigger
// is named like infra/terraform/topology.tf's run_service, and Eventarc
// names its subscription eventarc-<region>-<trigger>-sub-<n>.
func eventarcSubscription(c Consumer, n int) string {
	sum := sha1.Sum([]byte(c.Subscription()))
	prefix := strings.TrimSuffix(fmt.Sprintf("%.31s", c.Service+"-"+c.Role), "-")
	trigger := "consume-" + prefix + "-" + hex.EncodeToString(sum[:])[:8]
	return fmt.Sprintf("projects/my-project/subscriptions/eventarc-europe-west1-%s-sub-%d", trigger, n)
}

// The map Terraform builds for the repository's topology (its Eventarc
// consumers only) goes through JSON, as DLQREPLAY_SUBSCRIPTIONS carries it,
// and resolves both ways: logical → real for seek and snapshots, real →
// consumer for the dead letters Pub/Sub stamps with the real name.
func TestSubscriptionMapRoundTripsThroughTheTopology(t *testing.T) {
	top, err := Load("")
	if err != nil {
		t.Fatal(err)
	}
	entries := map[string]string{}
	for i, c := range top.Consumers() {
		if c.Delivery == DeliveryEventarc {
			entries[c.Subscription()] = eventarcSubscription(c, 100+i)
		}
	}
	if len(entries) == 0 {
		t.Fatal("the topology has no Eventarc consumer; the test needs one")
	}
	js, _ := json.Marshal(entries)
	m, err := ParseSubscriptionMap(top, string(js))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range top.Consumers() {
		logical := c.Subscription()
		real := m.Real(logical)
		if want, mapped := entries[logical]; mapped {
			if !strings.HasPrefix(real, "eventarc-europe-west1-consume-") || strings.Contains(real, "/") || !strings.HasSuffix(want, "/"+real) {
				t.Errorf("%s: real %q, want the id of %q", logical, real, want)
			}
		} else if real != logical {
			t.Errorf("%s (push) maps to %q, want itself", logical, real)
		}
		for _, name := range []string{real, "projects/my-project/subscriptions/" + real, logical} {
			got, ok := m.Consumer(name)
			if !ok || got.Topic != c.Topic || got.Service != c.Service {
				t.Errorf("Consumer(%q) = %+v %v, want %s on %s", name, got, ok, c.Service, c.Topic)
			}
		}
		if m.Logical(real) != logical {
			t.Errorf("Logical(%q) = %q, want %q", real, m.Logical(real), logical)
		}
	}
	// And back to JSON: the bare ids, readable again to the same map.
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	again, err := ParseSubscriptionMap(top, string(out))
	if err != nil {
		t.Fatal(err)
	}
	for k := range entries {
		if again.Real(k) != m.Real(k) {
			t.Errorf("%s: %q after a second round trip, want %q", k, again.Real(k), m.Real(k))
		}
	}
}

func TestSubscriptionMapRefusesWhatCannotBeResolved(t *testing.T) {
	top, err := Load("")
	if err != nil {
		t.Fatal(err)
	}
	const eventarc = "shop.order.events.message-service-processor"
	const push = "shop.order.events.member-service-processor"
	for _, c := range []struct {
		name, js, want string
	}{
		{"not json", `["a"]`, "a JSON object"},
		{"unknown consumer", `{"shop.order.events.nobody-processor": "eventarc-x-sub-1"}`, `key "shop.order.events.nobody-processor": not a consumer subscription`},
		{"bad id", `{"` + eventarc + `": "9bad"}`, "3 to 255 characters"},
		{"goog prefix", `{"` + eventarc + `": "goog-sub"}`, "not with goog"},
		{"two consumers, one subscription", `{"` + eventarc + `": "eventarc-a-sub-1", "` + push + `": "eventarc-a-sub-1"}`, "is already the subscription of"},
		{"another consumer's name", `{"` + eventarc + `": "` + push + `"}`, "another consumer's logical subscription"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseSubscriptionMap(top, c.js)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), EnvSubscriptions) {
				t.Errorf("error %v, want one naming %s and saying %q", err, EnvSubscriptions, c.want)
			}
		})
	}
	for _, empty := range []string{"", "  ", "{}"} {
		m, err := ParseSubscriptionMap(top, empty)
		if err != nil || m.Real(eventarc) != eventarc {
			t.Errorf("%q: %v, %q", empty, err, m.Real(eventarc))
		}
	}
	var none *SubscriptionMap
	if none.Real(eventarc) != eventarc || none.Logical("projects/p/subscriptions/x-y") != "x-y" {
		t.Error("a nil map must map every name to itself")
	}
}
