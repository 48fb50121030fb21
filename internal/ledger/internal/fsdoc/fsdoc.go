// Package fsdoc holds what the ledger's packages share about its Firestore
// documents: the query shapes every query is built from (and the fields
// they use), and the reads of event documents and their attempts. The
// write path (internal/ledger), the console's queries (internal/ledger/query)
// and the consumer registry (internal/ledger/consumers) build on it; nothing
// outside the ledger can import it.
package fsdoc

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"cloud.google.com/go/firestore"
	"google.golang.org/api/iterator"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/relaybus/relaybus/internal/ledger/model"
)

// Get reads one document (one read, found or not), in tx when it is not
// nil.
func Get(ctx context.Context, tx *firestore.Transaction, ref *firestore.DocumentRef) (*firestore.DocumentSnapshot, error) {
	if tx != nil {
		return tx.Get(ref)
	}
	return ref.Get(ctx)
}

// GetAll reads the documents of refs by id, at most MaxGetAll to a
// request, and returns the snapshots in refs' order (a
// document that does not exist has a snapshot whose Exists is false).
func GetAll(ctx context.Context, c *firestore.Client, refs []*firestore.DocumentRef) ([]*firestore.DocumentSnapshot, error) {
	out := make([]*firestore.DocumentSnapshot, 0, len(refs))
	for len(refs) > 0 {
		n := min(len(refs), MaxGetAll)
		snaps, err := c.GetAll(ctx, refs[:n])
		if err != nil {
			return nil, err
		}
		out = append(out, snaps...)
		refs = refs[n:]
	}
	return out, nil
}

// MaxGetAll is the most documents one GetAll asks for.
const MaxGetAll = 500

// Query runs a query to the end, in tx when it is not nil.
func Query(ctx context.Context, tx *firestore.Transaction, q firestore.Query) ([]*firestore.DocumentSnapshot, error) {
	var it *firestore.DocumentIterator
	if tx != nil {
		it = tx.Documents(q)
	} else {
		it = q.Documents(ctx)
	}
	defer it.Stop()
	var out []*firestore.DocumentSnapshot
	for {
		d, err := it.Next()
		if errors.Is(err, iterator.Done) {
			break
		}
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

// EventRef returns an event's document.
func EventRef(c *firestore.Client, eventID string) *firestore.DocumentRef {
	return c.Collection(model.CollectionEvents).Doc(model.EventDocID(eventID))
}

// Attempts returns an event's event_consumptions subcollection.
//
// Attempts live under their event (events/{id}/event_consumptions/{id})
// rather than in one top-level collection so that reading an event's
// attempts in a transaction locks that event's attempts alone: the
// Firestore emulator locks a whole collection for a query in a
// transaction, so with one top-level collection every rollup would hold up
// every attempt insert of every event in local runs. In production both
// layouts lock only the range read. The attempt's document need not wait
// for its event's: Firestore allows documents under a missing parent.
func Attempts(c *firestore.Client, eventID string) *firestore.CollectionRef {
	return EventRef(c, eventID).Collection(model.CollectionConsumptions)
}

// AttemptsQuery selects every attempt of an event.
func AttemptsQuery(c *firestore.Client, eventID string) firestore.Query {
	return ShapeAttemptsOfEvent.Query(Attempts(c, eventID).Query, nil)
}

// ReadAttempts returns every attempt of an event, ordered by consumer and
// attempt number.
func ReadAttempts(ctx context.Context, tx *firestore.Transaction, c *firestore.Client, eventID string) ([]model.Attempt, error) {
	snaps, err := Query(ctx, tx, AttemptsQuery(c, eventID))
	if err != nil {
		return nil, fmt.Errorf("read attempts of %s: %w", eventID, err)
	}
	out := make([]model.Attempt, 0, len(snaps))
	for _, d := range snaps {
		var a model.Attempt
		if err := d.DataTo(&a); err != nil {
			return nil, fmt.Errorf("decode attempt %s: %w", d.Ref.ID, err)
		}
		out = append(out, a)
	}
	model.SortAttempts(out)
	return out, nil
}

// EventAttempts returns every attempt of the event d is the document of:
// its attempt documents and its folded ones (WithFolded).
func EventAttempts(ctx context.Context, tx *firestore.Transaction, c *firestore.Client, d *model.Event) ([]model.Attempt, error) {
	docs, err := ReadAttempts(ctx, tx, c, d.EventID)
	if err != nil {
		return nil, err
	}
	return model.WithFolded(d, docs), nil
}

// NotFound reports whether a Firestore error means the document is absent.
func NotFound(err error) bool { return status.Code(err) == codes.NotFound }

// AlreadyExists reports whether a Firestore error means a create found the
// document there.
func AlreadyExists(err error) bool { return status.Code(err) == codes.AlreadyExists }

// SortedKeys returns m's keys in order.
func SortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
