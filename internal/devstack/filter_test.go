package devstack

import (
	"testing"

	"github.com/relaybus/relaybus/shared/topology"
)

func TestFilterMatchesAsPubSubDoes(t *testing.T) {
	member := topology.Consumer{Service: "member-service"}
	cases := []struct {
		filter string
		attrs  map[string]string
		want   bool
	}{
		{"", map[string]string{"a": "b"}, true},
		{member.Filter(), map[string]string{}, true},
		{member.Filter(), map[string]string{"target_consumer": "member-service"}, true},
		{member.Filter(), map[string]string{"target_consumer": "message-service"}, false},
		{`(attributes.event_type = "order.purchased") AND (` + member.ReplayFilter() + `)`, map[string]string{"event_type": "order.purchased"}, true},
		{`(attributes.event_type = "order.purchased") AND (` + member.ReplayFilter() + `)`, map[string]string{"event_type": "order.cancelled"}, false},
		{`attributes.k != "v"`, map[string]string{}, true},
		{`attributes.k != "v"`, map[string]string{"k": "v"}, false},
		{`-attributes:k`, map[string]string{"k": ""}, false},
		{`hasPrefix(attributes.k, "ord")`, map[string]string{"k": "order"}, true},
		{`hasPrefix(attributes.k, "ord")`, map[string]string{"k": "member"}, false},
		{`attributes."odd key" = "x\"y"`, map[string]string{"odd key": `x"y`}, true},
		{`attributes:a OR attributes:b OR attributes:c`, map[string]string{"c": "1"}, true},
		{`NOT (attributes:a AND attributes:b)`, map[string]string{"a": "1", "b": "1"}, false},
	}
	for _, c := range cases {
		f, err := parseFilter(c.filter)
		if err != nil {
			t.Errorf("parseFilter(%q): %v", c.filter, err)
			continue
		}
		got := f == nil || f.match(c.attrs)
		if got != c.want {
			t.Errorf("filter %q on %v = %v, want %v", c.filter, c.attrs, got, c.want)
		}
	}
}

func TestFilterRefusesWhatItCannotRead(t *testing.T) {
	for _, s := range []string{`attributes.k = v`, `attributes.k = "v`, `data:x`, `attributes:k AND`, `(attributes:k`, `attributes:k)`} {
		if _, err := parseFilter(s); err == nil {
			t.Errorf("parseFilter(%q) accepted it", s)
		}
	}
}
