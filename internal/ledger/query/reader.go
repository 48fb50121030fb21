// Package query is the ledger's read side, for the operators' console and
// the CLI: events listed and searched newest first ([Reader.List],
// [Reader.Search]), one event with every attempt of every consumer
// ([Reader.Get]), a trace as a tree ([Reader.Trace]), events by id
// ([Reader.Events]) and the overview's counts and hop times
// ([Reader.StatusCounts], [Reader.RecentHops], [Reader.ConsumedCounts]).
//
// It reads the documents internal/ledger writes and writes none. Every query
// is built from a shape of the ledger's QueryShapes, whose composite
// indexes infra/firestore/indexes.yaml declares; internal/ledger's doc
// comment describes the collections.
package query

import (
	"cloud.google.com/go/firestore"

	"github.com/relaybus/relaybus/internal/ledger/model"
)

// Reader answers the console's queries over the ledger's Firestore
// database. It is safe for concurrent use.
type Reader struct {
	client *firestore.Client
	events *firestore.CollectionRef
}

// New returns a reader on the ledger's client (ledger.Store.Client); it
// never closes the client.
func New(c *firestore.Client) *Reader {
	return &Reader{client: c, events: c.Collection(model.CollectionEvents)}
}
