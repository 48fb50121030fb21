package topology

import "github.com/relaybus/relaybus/internal/privacy"

// PrivacyRules returns the privacy rule of every topic that declares one
// (Topic.Privacy), by topic name.
func (t *Topology) PrivacyRules() privacy.Rules {
	out := privacy.Rules{}
	for _, tp := range t.Topics {
		if tp.Privacy.Declared() {
			out[tp.Name] = tp.Privacy
		}
	}
	return out
}
