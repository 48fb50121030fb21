package archive

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"cloud.google.com/go/firestore"

	"github.com/relaybus/relaybus/internal/cloudevent"
	"github.com/relaybus/relaybus/internal/privacy"
	"github.com/relaybus/relaybus/shared/event"
)

// EraseSubject turns every letter of the subject into an erased tombstone:
// its message data and error text are removed, and it is marked deleted
// (by "erasure: " + by) and erased, so it can no longer be read or
// replayed (a replay answers that the letter was deleted). Letters already
// erased are left alone. It returns how many letters it changed.
//
// Only letters of topics whose rule names a subject are looked at: a letter
// whose event decodes is the subject's when its payload names the subject
// at the rule's pointer; one that does not decode (poison) is the subject's
// when its data holds the subject id as a JSON string. Dead letters are few:
// it reads the letters of those topics.
func (s *Store) EraseSubject(ctx context.Context, subject string, rules privacy.Rules, by string) (int, error) {
	topics := rules.Subjects()
	if subject == "" || len(topics) == 0 {
		return 0, nil
	}
	quoted, _ := json.Marshal(subject)
	n := 0
	var errs []error
	// Firestore's "in" takes at most 30 values.
	for start := 0; start < len(topics); start += 30 {
		chunk := topics[start:min(start+30, len(topics))]
		docs, err := s.col.Where("topic", "in", chunk).Documents(ctx).GetAll()
		if err != nil {
			return n, fmt.Errorf("archive: erase subject: %w", err)
		}
		for _, snap := range docs {
			var l Letter
			if err := snap.DataTo(&l); err != nil {
				errs = append(errs, fmt.Errorf("archive: erase subject: decode %s: %w", snap.Ref.ID, err))
				continue
			}
			if l.Erased || !letterOf(&l, subject, quoted, rules.Of(l.Topic)) {
				continue
			}
			if _, err := snap.Ref.Update(ctx, []firestore.Update{
				{Path: "data", Value: []byte{}}, {Path: "error", Value: firestore.Delete},
				{Path: "erased", Value: true}, {Path: "deleted", Value: true},
				{Path: "deletedBy", Value: "erasure: " + by}, {Path: "deletedAt", Value: s.now()},
			}); err != nil {
				errs = append(errs, fmt.Errorf("archive: erase subject: %s: %w", l.ID, err))
				continue
			}
			n++
		}
	}
	return n, errors.Join(errs...)
}

// letterOf reports whether a letter carries the subject's payload.
func letterOf(l *Letter, subject string, quoted []byte, r privacy.Rule) bool {
	e, _, err := cloudevent.Decode(l.Original(), event.Limits{MaxPayloadBytes: event.MaxPayloadLimit})
	if err == nil {
		got, ok := r.SubjectOf(e.Payload)
		return ok && got == subject
	}
	return bytes.Contains(l.Data, quoted) || (l.Error != "" && bytes.Contains([]byte(l.Error), quoted))
}
