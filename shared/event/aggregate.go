package event

import (
	"errors"
	"strings"
)

// MaxAggregateIDLength is the longest aggregate id accepted.
const MaxAggregateIDLength = 256

// Where an aggregate id was found, in the order ExtractAggregateID looks.
const (
	FromEnvelope    = "envelope"
	FromAttribute   = "attribute"
	FromOrderingKey = "ordering_key"
)

// ErrNoAggregateID is returned by ExtractAggregateID when no source holds an id.
var ErrNoAggregateID = errors.New("no aggregate id in the envelope, the aggregate_id attribute or the ordering key")

// ExtractAggregateID picks the aggregate id by the fixed precedence
// envelope > attribute > ordering key: the first non-blank source wins, is
// trimmed, and must pass ValidateAggregateID. It returns the id and the name of
// the source it came from (FromEnvelope, FromAttribute, FromOrderingKey).
//
// A present but invalid id is an error even if a later source holds a valid
// one: the precedence is deterministic, never a search for something that
// passes.
func ExtractAggregateID(envelope, attribute, orderingKey string) (id, from string, err error) {
	for _, c := range [...]struct{ v, from string }{
		{envelope, FromEnvelope}, {attribute, FromAttribute}, {orderingKey, FromOrderingKey},
	} {
		v := strings.TrimSpace(c.v)
		if v == "" {
			continue
		}
		if err := ValidateAggregateID(v); err != nil {
			return "", c.from, err
		}
		return v, c.from, nil
	}
	return "", "", ErrNoAggregateID
}

// ValidateAggregateID checks an already trimmed aggregate id: 1 to 256
// characters of [A-Za-z0-9:_-].
func ValidateAggregateID(id string) error {
	if id == "" {
		return fieldErr("aggregateId", ruleAggregateID)
	}
	if len(id) > MaxAggregateIDLength {
		return fieldErr("aggregateId", "at most %d characters (got %d)", MaxAggregateIDLength, len(id))
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(isAlnum(c) || c == ':' || c == '_' || c == '-') {
			return fieldErr("aggregateId", "only [A-Za-z0-9:_-] allowed (found %q at position %d)", c, i)
		}
	}
	return nil
}
