package ledger

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	"github.com/relaybus/relaybus/shared/event"
)

// Shards is the number of index shards of the events collection. Every
// event document carries shard = a hash of its id modulo Shards, and every
// composite index that ends in a timestamp starts with shard, so that the
// index entries new events add land in Shards separate key ranges instead of
// one (Firestore limits a collection whose indexed field increases
// monotonically to about 500 writes per second per key range). Queries ask
// for all shards at once with `shard in [0..Shards-1]`; Firestore merges the
// ranges in order on the server.
//
// Changing Shards re-shards nothing already written: it may only grow, and
// only together with a backfill of the shard field.
const Shards = 8

// spread hashes an event id: the first 64 bits of its SHA-256, so that ids
// differing in one character land far apart.
func spread(eventID string) uint64 {
	sum := sha256.Sum256([]byte(eventID))
	return binary.BigEndian.Uint64(sum[:8])
}

// EventDocID is the id of an event's document: four hex digits of a hash of
// the event id, "~", and the event id. The prefix spreads documents over
// Firestore's key space whatever scheme producers use for their ids
// (time-ordered ids such as UUIDv7 or ULIDs would otherwise all land at the
// end of one key range), and makes every valid event id a valid document id
// (ids such as "__x__" are reserved by Firestore). "~" cannot occur in an
// event id, so the mapping is one to one.
func EventDocID(eventID string) string {
	return fmt.Sprintf("%04x~%s", spread(eventID)>>48, eventID)
}

// ShardOf returns the index shard of an event id, in [0, Shards).
func ShardOf(eventID string) int { return int(spread(eventID) % Shards) }

// eventIDRule is the event id rule the ledger enforces on lookups (the same
// as event.Event's).
const eventIDRule = "required: 1 to 128 characters of [A-Za-z0-9._:-]"

// checkEventID validates an event id given to a lookup or a notice.
func checkEventID(id string) error {
	if len(id) == 0 || len(id) > 128 {
		return &event.FieldError{Field: "eventId", Rule: eventIDRule}
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == ':' || c == '-') {
			return &event.FieldError{Field: "eventId", Rule: eventIDRule}
		}
	}
	return nil
}

// CheckEventID validates an event id as every ledger lookup does: 1 to 128
// characters of [A-Za-z0-9._:-]. The error is an *event.FieldError naming
// eventId.
func CheckEventID(id string) error { return checkEventID(id) }
