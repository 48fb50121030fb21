package relay

import (
	"fmt"
	"testing"

	"github.com/relaybus/relaybus/shared/outbox"
)

// The ledger cursor moves gathered over a second go in as few statements
// as one UPDATE ... FROM allows: an aggregate at most once per statement.
func TestMergeRecorded(t *testing.T) {
	a, b := outbox.Aggregate{Type: "order", ID: "a"}, outbox.Aggregate{Type: "order", ID: "b"}
	mv := func(ag outbox.Aggregate, from, to int64) outbox.Recorded {
		return outbox.Recorded{Aggregate: ag, From: from, To: to}
	}
	for _, tc := range []struct {
		name string
		in   []outbox.Recorded
		want string
	}{
		{"none", nil, "[]"},
		{"one aggregate's runs in order fold into one move", []outbox.Recorded{mv(a, 0, 2), mv(a, 2, 3), mv(a, 3, 7)},
			"[[{a 0 7}]]"},
		{"two aggregates interleaved", []outbox.Recorded{mv(a, 0, 1), mv(b, 4, 5), mv(a, 1, 2), mv(b, 5, 9)},
			"[[{a 0 2} {b 4 9}]]"},
		{"a move that does not follow on waits for the next statement",
			[]outbox.Recorded{mv(a, 0, 1), mv(a, 5, 6), mv(b, 0, 1), mv(a, 6, 8)},
			"[[{a 0 1} {b 0 1}] [{a 5 8}]]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rounds := mergeRecorded(tc.in)
			got := "["
			for i, r := range rounds {
				if i > 0 {
					got += " "
				}
				got += "["
				for j, m := range r {
					if j > 0 {
						got += " "
					}
					got += fmt.Sprintf("{%s %d %d}", m.ID, m.From, m.To)
				}
				got += "]"
			}
			got += "]"
			if got != tc.want {
				t.Errorf("mergeRecorded = %s, want %s", got, tc.want)
			}
		})
	}
}
