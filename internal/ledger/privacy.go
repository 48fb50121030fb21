package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"cloud.google.com/go/firestore"

	"github.com/relaybus/relaybus/internal/ledger/model"
	"github.com/relaybus/relaybus/internal/privacy"
	"github.com/relaybus/relaybus/shared/event"
)

// applyPrivacy makes a new event document keep what the topic's privacy
// rule lets the ledger keep of e's payload, and records the subject key
// erasure finds it by. A payload the rule cannot be applied to (no key) is
// not kept: the ledger never holds more than the rule allows.
func (s *Store) applyPrivacy(ctx context.Context, d *model.Event, e *event.Event) {
	if e == nil {
		return
	}
	r, ok := s.privacy[e.Topic]
	if !ok {
		return
	}
	if r.Subject != "" && !s.privKey.IsZero() {
		if sub, ok := r.SubjectOf(e.Payload); ok {
			d.SubjectKey = s.privKey.SubjectKey(sub)
		}
	}
	if len(d.Payload) == 0 {
		return
	}
	res, err := r.Apply(privacy.Ledger, d.Payload, s.privKey)
	if err != nil {
		s.log.ErrorContext(ctx, "ledger: payload not kept: the topic's privacy rule could not be applied", "topic", e.Topic, "event_id", e.ID, "error", err.Error())
		res = privacy.Result{Dropped: true}
	}
	d.Payload, d.RedactedFields = res.Payload, res.Redacted
	if res.Dropped {
		d.Payload, d.PayloadWithheld = nil, true
	}
}

// EraseSubject removes the payload of every event document recorded with
// subjectKey (privacy.Key.SubjectKey of the subject id): the payload and
// its redacted fields are deleted, payloadErased and erasedAt set; the
// delivery record (status, consumers, attempts) stays. Documents already
// erased are left alone, so it is idempotent. It returns how many
// documents it changed.
//
// It finds only documents written while the topic's rule named a subject
// and the store had the privacy key. Cost: one query (reads as many
// documents as the subject has events) and one write per event not yet
// erased.
func (s *Store) EraseSubject(ctx context.Context, subjectKey string, at time.Time) (int, error) {
	if subjectKey == "" {
		return 0, errors.New("ledger: erase subject: no subject key")
	}
	docs, err := s.events.Where("subjectKey", "==", subjectKey).Documents(ctx).GetAll()
	if err != nil {
		return 0, fmt.Errorf("ledger: erase subject: %w", err)
	}
	bw := s.client.BulkWriter(ctx)
	var jobs []*firestore.BulkWriterJob
	for _, snap := range docs {
		if erased, _ := snap.DataAt("payloadErased"); erased == true {
			continue
		}
		j, err := bw.Update(snap.Ref, []firestore.Update{
			{Path: "payload", Value: firestore.Delete},
			{Path: "redactedFields", Value: firestore.Delete},
			{Path: "payloadErased", Value: true},
			{Path: "erasedAt", Value: at.UTC()},
			{Path: "updatedAt", Value: s.clock()},
		})
		if err != nil {
			bw.End()
			return 0, fmt.Errorf("ledger: erase subject: %w", err)
		}
		jobs = append(jobs, j)
	}
	bw.End()
	n := 0
	var errs []error
	for _, j := range jobs {
		if _, err := j.Results(); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
	}
	if err := errors.Join(errs...); err != nil {
		return n, fmt.Errorf("ledger: erase subject: %w", err)
	}
	return n, nil
}

// PrivacyKey returns the key the store hashes with (Options.PrivacyKey).
func (s *Store) PrivacyKey() privacy.Key { return s.privKey }
