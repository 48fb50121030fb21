package model

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	"github.com/relaybus/relaybus/shared/event"
)

// Index shards of the events collection. Every event document carries
// shard = a hash of its id modulo the store's shard count (ledger.Options.Shards,
// DefaultShards), and every composite index whose entries would otherwise
// be ordered by a time (occurredAt, expireDue, checkAt) or by an id that
// may grow with time (aggregateId) starts with shard, so that the entries
// new events add land in as many separate key ranges instead of one.
// Firestore sustains about 500 writes per second into one such range
// ("500/50/5" and hotspots, https://firebase.google.com/docs/firestore/best-practices),
// so the shard count is sized for the target rate: each range takes
// rate / shards new entries per second (a status change adds one more to
// the status indexes, in another range), and shards >= rate / 500.
// DefaultShards = 20 holds 10,000 events/s.
//
// Queries ask for every shard that can exist, `shard in [0..MaxShards-1]`,
// and Firestore merges the ranges in order on the server; so the shard
// count can be changed at any time, up or down, without re-sharding
// anything written (documents keep the shard they were written with, and
// a ledger written with the former fixed 8 shards is read as it is).
// MaxShards is Firestore's limit of 30 disjunctions per query
// (https://firebase.google.com/docs/firestore/query-data/queries#limits_on_or_queries).
const (
	DefaultShards = 20
	MaxShards     = 30
)

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

// ShardOf returns the index shard of an event id among DefaultShards, in
// [0, DefaultShards).
func ShardOf(eventID string) int { return shardOf(eventID, DefaultShards) }

// shardOf returns the index shard of an event id among n.
func shardOf(eventID string, n int) int { return int(spread(eventID) % uint64(n)) }

// eventIDRule is the event id rule the ledger enforces on lookups (the same
// as event.Event's).
const eventIDRule = "required: 1 to 128 characters of [A-Za-z0-9._:-]"

// CheckEventID validates an event id as every ledger lookup does: 1 to 128
// characters of [A-Za-z0-9._:-]. The error is an *event.FieldError naming
// eventId.
func CheckEventID(id string) error {
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
