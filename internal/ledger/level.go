package ledger

import "github.com/relaybus/relaybus/internal/ledger/model"

// level returns a topic's level (Options.Levels, model.DefaultLevel when it
// names none).
func (s *Store) level(topic string) model.Level {
	if l, ok := s.levels[topic]; ok && l != "" {
		return l
	}
	return model.DefaultLevel
}
