package topology

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/relaybus/relaybus/internal/names"
)

// EnvSubscriptions names the variable that carries a SubscriptionMap as a
// JSON object (dlqreplay reads it: DLQREPLAY_SUBSCRIPTIONS).
const EnvSubscriptions = "DLQREPLAY_SUBSCRIPTIONS"

// PubSubSubscriptionRule is Pub/Sub's rule for a subscription id, quoted in
// errors.
const PubSubSubscriptionRule = "a Pub/Sub subscription id is 3 to 255 characters of [A-Za-z0-9-_.~+%], starting with a letter and not with goog (a full projects/<p>/subscriptions/<id> name is accepted too)"

// SubscriptionMap maps each consumer's logical subscription id
// (<topic>.<service>-<role>, the name the topology gives it) to the Pub/Sub
// subscription that really delivers to it, where the two differ: an
// Eventarc trigger creates its own subscription,
// eventarc-<region>-<trigger>-sub-<n>, and that is the name Pub/Sub stamps
// on the consumer's dead letters (CloudPubSubDeadLetterSourceSubscription)
// and the name seek and snapshots need. Terraform knows it
// (google_eventarc_trigger.transport[0].pubsub[0].subscription) and passes
// the map to dlqreplay; consumers it does not list (push subscriptions,
// which relaybus names itself) map to their logical id.
//
// The zero value and a nil map are empty and usable: every name maps to
// itself.
type SubscriptionMap struct {
	top     *Topology
	real    map[string]string // logical id → real id
	logical map[string]string // real id → logical id
}

// ParseSubscriptionMap reads a map from its JSON form, an object of logical
// subscription id → real subscription id (a bare id or a full
// projects/<p>/subscriptions/<id> name). An empty string is an empty map.
// Every key must be a consumer subscription of t, every value a valid
// Pub/Sub subscription id, and no two keys may share a value; each
// violation is reported with the rule it broke.
func ParseSubscriptionMap(t *Topology, js string) (*SubscriptionMap, error) {
	entries := map[string]string{}
	if strings.TrimSpace(js) != "" {
		if err := json.Unmarshal([]byte(js), &entries); err != nil {
			return nil, fmt.Errorf("%s: a JSON object of logical subscription id to real subscription id: %w", EnvSubscriptions, err)
		}
	}
	return NewSubscriptionMap(t, entries)
}

// NewSubscriptionMap builds a map from logical → real entries, validated as
// ParseSubscriptionMap does.
func NewSubscriptionMap(t *Topology, entries map[string]string) (*SubscriptionMap, error) {
	m := &SubscriptionMap{top: t, real: map[string]string{}, logical: map[string]string{}}
	var errs []string
	keys := make([]string, 0, len(entries))
	for k := range entries {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := names.ResourceID(strings.TrimSpace(entries[k]))
		if _, ok := t.Consumer(k); !ok || strings.Contains(k, "/") {
			errs = append(errs, fmt.Sprintf("key %q: not a consumer subscription of the topology (<topic>.<service>-<role>)", k))
			continue
		}
		if !validPubSubID(v) {
			errs = append(errs, fmt.Sprintf("%q: value %q: %s", k, entries[k], PubSubSubscriptionRule))
			continue
		}
		if other, dup := m.logical[v]; dup {
			errs = append(errs, fmt.Sprintf("%q: value %q is already the subscription of %q", k, v, other))
			continue
		}
		if c, ok := t.Consumer(v); ok && c.Subscription() != k {
			errs = append(errs, fmt.Sprintf("%q: value %q is another consumer's logical subscription", k, v))
			continue
		}
		if v == k {
			continue
		}
		m.real[k], m.logical[v] = v, k
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%s: %s", EnvSubscriptions, strings.Join(errs, "; "))
	}
	return m, nil
}

// validPubSubID checks Pub/Sub's resource id rule.
func validPubSubID(s string) bool {
	if len(s) < 3 || len(s) > 255 || !(s[0] >= 'a' && s[0] <= 'z' || s[0] >= 'A' && s[0] <= 'Z') || strings.HasPrefix(strings.ToLower(s), "goog") {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("-_.~+%", c) >= 0) {
			return false
		}
	}
	return true
}

// Real returns the id of the Pub/Sub subscription that delivers the
// consumer whose logical subscription id is logical: its mapped id, or
// logical itself when the map does not list it.
func (m *SubscriptionMap) Real(logical string) string {
	if m != nil {
		if r, ok := m.real[logical]; ok {
			return r
		}
	}
	return logical
}

// Logical returns the logical subscription id of a real subscription (a
// bare id or a full name), or the bare id itself when the map does not
// list it.
func (m *SubscriptionMap) Logical(real string) string {
	id := names.ResourceID(real)
	if m != nil {
		if l, ok := m.logical[id]; ok {
			return l
		}
	}
	return id
}

// Consumer returns the consumer a subscription name (real or logical, bare
// or full) delivers to, or false when it is none of the topology's.
func (m *SubscriptionMap) Consumer(name string) (Consumer, bool) {
	if m == nil || m.top == nil {
		return Consumer{}, false
	}
	return m.top.Consumer(m.Logical(name))
}

// Entries returns a copy of the mapped entries, logical → real.
func (m *SubscriptionMap) Entries() map[string]string {
	out := map[string]string{}
	if m != nil {
		for k, v := range m.real {
			out[k] = v
		}
	}
	return out
}

// MarshalJSON writes the JSON form ParseSubscriptionMap reads.
func (m *SubscriptionMap) MarshalJSON() ([]byte, error) { return json.Marshal(m.Entries()) }
