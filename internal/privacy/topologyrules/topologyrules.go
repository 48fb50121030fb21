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
