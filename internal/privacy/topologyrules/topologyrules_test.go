package topologyrules_test

import (
	"testing"

	"github.com/relaybus/relaybus/internal/privacy"
	"github.com/relaybus/relaybus/internal/privacy/topologyrules"
	"github.com/relaybus/relaybus/shared/topology"
)

// The history keeps each topic's payloads as its rule's history mode says:
// redact hashes the personal fields, drop (and redact of a payload that is
// not JSON) keeps the tombstone, whole (and no rule) is not rewritten.
func TestHistoryKeep(t *testing.T) {
	key, err := privacy.NewKey("history-keep-key-0123456789")
	if err != nil {
		t.Fatal(err)
	}
	top := &topology.Topology{Topics: []topology.Topic{
		{Name: "redacted", Privacy: topology.Privacy{Fields: []string{"/email"}, History: "redact"}},
		{Name: "dropped", Privacy: topology.Privacy{Fields: []string{"/email"}, History: "drop"}},
		{Name: "default", Privacy: topology.Privacy{Fields: []string{"/email"}}},
		{Name: "none"},
	}}
	keep := topologyrules.HistoryKeep(top, key)
	if len(keep) != 2 || keep["default"] != nil || keep["none"] != nil {
		t.Fatalf("HistoryKeep names %d topics, want redacted and dropped only (the default keeps the history whole)", len(keep))
	}
	for _, tc := range []struct {
		topic, payload, want string
	}{
		{"redacted", `{"email":"ann@example.com","n":1}`, `{"email":"` + key.HashValue("ann@example.com") + `","n":1}`},
		{"redacted", `{"n":1}`, `{"n":1}`},
		{"redacted", "not json", topologyrules.Tombstone},
		{"dropped", `{"email":"ann@example.com"}`, topologyrules.Tombstone},
	} {
		got, err := keep[tc.topic]([]byte(tc.payload))
		if err != nil || string(got) != tc.want {
			t.Errorf("%s %s: %s (%v), want %s", tc.topic, tc.payload, got, err, tc.want)
		}
	}
	if _, err := topologyrules.HistoryKeep(top, privacy.Key{})["redacted"]([]byte(`{"email":"x"}`)); err == nil {
		t.Error("redact without a key kept a payload; want an error (the purge stops, nothing is lost)")
	}
}
