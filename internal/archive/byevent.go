package archive

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"google.golang.org/api/iterator"
)

// MaxEventLetters bounds how many letters ByEvent reads for one event.
const MaxEventLetters = 100

// ByEvent returns the letters of one event that f matches (f.EventID is
// set to eventID), newest first. It queries the event's letters alone
// (eventId's single-field index), where List reads the archive in order:
// for a replay job, which looks letters up event by event, that is one
// query of a few documents per event instead of a scan per event.
// Cost: one read per letter of the event, at most MaxEventLetters.
func (s *Store) ByEvent(ctx context.Context, eventID string, f Filter) ([]Letter, error) {
	f.EventID = eventID
	it := s.col.Where("eventId", "==", eventID).Limit(MaxEventLetters).Documents(ctx)
	defer it.Stop()
	var out []Letter
	for {
		snap, err := it.Next()
		if errors.Is(err, iterator.Done) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("archive: letters of %s: %w", eventID, err)
		}
		var l Letter
		if err := snap.DataTo(&l); err != nil {
			return nil, fmt.Errorf("archive: decode %s: %w", snap.Ref.ID, err)
		}
		s.resolve(&l)
		if f.match(&l) {
			out = append(out, l)
		}
	}
	// Newest first, as List answers (the query has no order, which would
	// need a composite index).
	sort.SliceStable(out, func(i, j int) bool { return out[i].ArchivedAt.After(out[j].ArchivedAt) })
	return out, nil
}
