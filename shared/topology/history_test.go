package topology

import (
	"strings"
	"testing"
	"time"
)

// history_retention_days: 90 days when left out, 0 for none, refused
// outside 0..3650 with the field and the rule.
func TestHistoryRetention(t *testing.T) {
	base := `
rollup: {topic: relaybus.ledger.rollup}
topics:
  - name: shop.order.events
    consumers:
      - service: member-service
`
	for _, tc := range []struct {
		extra string
		want  time.Duration
		err   string
	}{
		{"", 90 * 24 * time.Hour, ""},
		{"    history_retention_days: 0\n", 0, ""},
		{"    history_retention_days: 7\n", 7 * 24 * time.Hour, ""},
		{"    history_retention_days: -1\n", 0, "history_retention_days: must be 0 (no history) to 3650 days, not -1"},
		{"    history_retention_days: 3651\n", 0, "history_retention_days: must be 0 (no history) to 3650 days, not 3651"},
	} {
		top, err := Parse([]byte(base + tc.extra))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: err %v, want %q", tc.extra, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%q: %v", tc.extra, err)
		}
		if got := top.Topic("shop.order.events").HistoryRetention(); got != tc.want {
			t.Errorf("%q: retention %s, want %s", tc.extra, got, tc.want)
		}
	}
}
