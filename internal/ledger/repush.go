package ledger

import (
	"context"
	"fmt"
	"time"

	"github.com/relaybus/relaybus/internal/ledger/model"

	"cloud.google.com/go/firestore"

	"github.com/relaybus/relaybus/internal/names"
	"github.com/relaybus/relaybus/shared/event"
)

// BeginRepush records an operator's re-push of an event, in one
// transaction: it reads the event, lets check refuse (check's error is
// returned as is, nothing is written), and otherwise sets status RETRYING,
// retryCount+1, lastSentAt = at and the re-push marker: which consumer was
// addressed ("" = every subscriber) and the attempt number each addressed
// expected consumer had reached, so the truth table keeps the event
// RETRYING until each of them has answered the re-push (or succeeded).
//
// Call it when the re-push is queued (outbox.Repush). If the re-push then
// cannot be published, the relay's final RecordPublishFailure settles the
// marker and the status is derived without it.
//
// It fails with model.ErrEventNotFound when the ledger has no such event.
// Cost: one read for the event, one per attempt of the event, one write.
func (s *Store) BeginRepush(ctx context.Context, eventID string, consumer string, check func(model.Event) error, at time.Time) (model.Event, error) {
	if err := model.CheckEventID(eventID); err != nil {
		return model.Event{}, fmt.Errorf("ledger: re-push: %w", err)
	}
	if consumer != "" {
		if err := names.ValidateConsumer(consumer); err != nil {
			return model.Event{}, fmt.Errorf("ledger: re-push %s: %w", eventID, &event.FieldError{Field: "consumer", Rule: names.ConsumerRule})
		}
	}
	at = at.UTC()
	ref := s.eventRef(eventID)
	var (
		out      model.Event
		checkErr error
	)
	err := s.client.RunTransaction(ctx, func(ctx context.Context, tx *firestore.Transaction) error {
		checkErr = nil
		snap, err := s.getDoc(ctx, tx, ref)
		if err != nil {
			if notFound(err) {
				return fmt.Errorf("%w: %s", model.ErrEventNotFound, eventID)
			}
			return err
		}
		var d model.Event
		if err := snap.DataTo(&d); err != nil {
			return fmt.Errorf("decode %s: %w", ref.ID, err)
		}
		if check != nil {
			if err := check(d); err != nil {
				checkErr = err
				return err
			}
		}
		attempts, err := s.eventAttempts(ctx, tx, &d)
		if err != nil {
			return err
		}
		latest := model.LatestByConsumer(attempts)
		addressed := d.ExpectedConsumers
		if consumer != "" {
			addressed = []string{consumer}
		}
		rp := &model.Repush{At: at, Consumer: consumer, Since: make([]model.ConsumerMark, 0, len(addressed))}
		for _, c := range addressed {
			rp.Since = append(rp.Since, model.ConsumerMark{ConsumerID: c, AttemptNo: latest[c].AttemptNo})
		}
		now := s.clock()
		d.Status, d.StatusAt = model.StatusRetrying, at
		d.RetryCount++
		d.LastSentAt = at
		d.UpdatedAt = now
		d.Repush = rp
		ups := []firestore.Update{
			{Path: "status", Value: d.Status}, {Path: "statusAt", Value: d.StatusAt},
			{Path: "retryCount", Value: d.RetryCount}, {Path: "lastSentAt", Value: d.LastSentAt},
			{Path: "updatedAt", Value: now}, {Path: "repush", Value: rp},
		}
		if !d.ExpireAt.IsZero() && d.ExpireDue.IsZero() {
			d.ExpireDue = d.ExpireAt
			ups = append(ups, firestore.Update{Path: "expireDue", Value: d.ExpireAt})
		}
		if d.CheckAt.IsZero() {
			// RETRYING is not settled: the reconciler looks again if the
			// re-push's attempts never reach the ledger.
			d.CheckAt = at.Add(s.reconcile)
			ups = append(ups, firestore.Update{Path: "checkAt", Value: d.CheckAt})
		}
		out = d
		return tx.Update(ref, ups)
	})
	if checkErr != nil {
		return model.Event{}, checkErr
	}
	if err != nil {
		return model.Event{}, fmt.Errorf("ledger: re-push %s: %w", eventID, err)
	}
	return out, nil
}
