// Package topologyrules reads the topics' privacy rules out of a topology
// (shared/topology's Topic.Privacy) as internal/privacy applies them.
package topologyrules

import (
	"github.com/relaybus/relaybus/internal/privacy"
	"github.com/relaybus/relaybus/shared/topology"
)

// Of returns the rule of every topic that declares one, by topic name.
func Of(top *topology.Topology) privacy.Rules {
	out := privacy.Rules{}
	if top == nil {
		return out
	}
	for _, tp := range top.Topics {
		if tp.Privacy.Declared() {
			out[tp.Name] = Rule(tp.Privacy)
		}
	}
	return out
}

// Rule returns one topology rule as internal/privacy's.
func Rule(p topology.Privacy) privacy.Rule {
	return privacy.Rule{Fields: p.Fields, Subject: p.Subject, Redaction: p.Redaction,
		LedgerMode: privacy.Mode(p.Ledger), ConsoleMode: privacy.Mode(p.Console), ArchiveMode: privacy.Mode(p.Archive),
		HistoryMode: privacy.Mode(p.History), LogsMode: privacy.Mode(p.Logs), TracesMode: privacy.Mode(p.Traces)}
}

// HistoryKeep returns, for each topic whose rule does not keep the history
// whole, what the history keeps of a payload (outbox.History.Keep): the
// payload with its personal fields hashed under key or removed (history:
// redact), or JSON null when the rule keeps none of it (history: drop, or
// redact of a payload that is not JSON), the tombstone an erasure leaves.
// Topics that keep the history whole are not named.
func HistoryKeep(top *topology.Topology, key privacy.Key) map[string]func([]byte) ([]byte, error) {
	out := map[string]func([]byte) ([]byte, error){}
	for name, r := range Of(top) {
		if r.Mode(privacy.History) == privacy.Whole {
			continue
		}
		out[name] = func(payload []byte) ([]byte, error) {
			res, err := r.Apply(privacy.History, payload, key)
			switch {
			case err != nil:
				return nil, err
			case res.Dropped:
				return []byte(Tombstone), nil
			}
			return res.Payload, nil
		}
	}
	return out
}

// Tombstone is the payload a history row keeps when its topic's rule keeps
// none of it: JSON null, as an erased outbox row holds.
const Tombstone = "null"
