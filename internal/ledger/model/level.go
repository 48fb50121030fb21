package model

import (
	"fmt"
	"strings"

	"github.com/relaybus/relaybus/shared/topology"
)

// Level is how much the ledger keeps of a topic's events, declared per
// topic in the topology (ledger: full | failures | off). See docs/ledger.md,
// "Levels and cost", for what each costs.
type Level string

// The levels.
const (
	// LevelFull keeps everything: the event's document (written when sent,
	// then once with its consumers' outcomes folded in) and every attempt
	// as a document of its own, first-attempt successes included: N + 2
	// writes per event with N consumers.
	LevelFull Level = "full"
	// LevelFailures (the default) keeps the event's document, written when
	// sent and once with its consumers' outcomes folded in, and keeps as
	// documents of their own only the attempts of consumers that did not
	// succeed at once (a failure, a retry, a park, and every attempt after
	// it), errors included: 2 writes per event in the happy path whatever
	// N. The first attempt of a consumer that succeeded lives in the
	// event's document (Event.Latest) and is shown like any other.
	LevelFailures Level = "failures"
	// LevelOff keeps nothing of the topic's events: no send, no attempt, no
	// status. Delivery is unaffected (the ledger never gates it).
	LevelOff Level = "off"
)

// DefaultLevel is the level of a topic that declares none: every status
// and every failure with its history, at a constant cost per event.
const DefaultLevel = LevelFailures

// ParseLevel reads a level name; empty is DefaultLevel.
func ParseLevel(s string) (Level, error) {
	switch l := Level(strings.ToLower(strings.TrimSpace(s))); l {
	case "":
		return DefaultLevel, nil
	case LevelFull, LevelFailures, LevelOff:
		return l, nil
	}
	return "", fmt.Errorf("ledger level %q: want full, failures or off", s)
}

// KeepsDocument reports whether an attempt is kept as a document of its
// own at level l: every attempt at full; at failures, all but a
// consumer's first attempt when it succeeded.
func (l Level) KeepsDocument(a Attempt) bool {
	return l == LevelFull || a.AttemptNo != 1 || !a.Success
}

// LevelsOf returns the ledger level of every topic of a topology (its
// ledger field; DefaultLevel where empty), for ledger.Options.Levels. The
// topology has validated the names.
func LevelsOf(top *topology.Topology) map[string]Level {
	out := make(map[string]Level, len(top.Topics))
	for _, tp := range top.Topics {
		l, err := ParseLevel(tp.Ledger)
		if err != nil {
			l = DefaultLevel
		}
		out[tp.Name] = l
	}
	return out
}
