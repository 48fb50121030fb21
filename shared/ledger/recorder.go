package ledger

import (
	"context"
	"fmt"
	"time"

	"github.com/googleapis/gax-go/v2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/relaybus/relaybus/shared/transport"
)

// DefaultRollupTopic is the rollup topic when the topology names none.
const DefaultRollupTopic = "relaybus.ledger.rollup"

// Recorder is consume's ledger: it records consumption attempts and tells
// rollup about them.
type Recorder struct {
	store *Store
	pub   transport.Publisher
	topic string
}

// NewRecorder returns a Recorder that inserts attempts into s and publishes
// rollup notices to topic (DefaultRollupTopic when empty) through pub.
func NewRecorder(s *Store, pub transport.Publisher, topic string) *Recorder {
	if topic == "" {
		topic = DefaultRollupTopic
	}
	return &Recorder{store: s, pub: pub, topic: topic}
}

// RecordAttempt inserts the attempt (document id AttemptDocID: recording
// the same attempt again changes nothing) and then publishes
// RollupMessage(a.EventID) to the rollup topic. If either step fails it
// returns the error and consume answers non-2xx; the redelivery records the
// same attempt again (a no-op) and publishes the notice again.
func (r *Recorder) RecordAttempt(ctx context.Context, a Attempt) error {
	if _, err := r.store.InsertAttempt(ctx, a); err != nil {
		return err
	}
	if _, err := r.pub.Publish(ctx, r.topic, RollupMessage(a.EventID)); err != nil {
		return fmt.Errorf("ledger: rollup notice for %s to %s: %w", a.EventID, r.topic, err)
	}
	return nil
}

// InsertAttempt writes an attempt into event_consumptions unless it is
// there already (created reports which). Attempts are insert-only: an
// existing document is never changed. ConsumedAt defaults to now;
// CreatedAt is always now; an error message is cut to 4 KiB.
// Cost: one write.
func (s *Store) InsertAttempt(ctx context.Context, a Attempt) (created bool, err error) {
	now := s.clock()
	if a.ConsumedAt.IsZero() {
		a.ConsumedAt = now
	}
	a.ConsumedAt = a.ConsumedAt.UTC()
	a.CreatedAt = now
	a.ErrorMessage = truncate(a.ErrorMessage, maxErrorText)
	if err := a.Validate(); err != nil {
		return false, fmt.Errorf("ledger: attempt of %s by %s: %w", a.EventID, a.ConsumerID, err)
	}
	ref := s.attempts(a.EventID).Doc(AttemptDocID(a.EventID, a.ConsumerID, a.AttemptNo))
	err = retryAborted(ctx, func() error {
		s.wrote(OpRecordAttempt, 1)
		_, err := ref.Create(ctx, a)
		return err
	})
	switch {
	case err == nil:
		return true, nil
	case alreadyExists(err):
		return false, nil
	}
	return false, fmt.Errorf("ledger: attempt %s: %w", ref.ID, err)
}

// retryAborted runs f again while Firestore answers ABORTED: a write that
// waited too long for the locks of a transaction reading the same range
// (a rollup reading the event's attempts) is refused that way and
// succeeds when retried.
func retryAborted(ctx context.Context, f func() error) error {
	bo := gax.Backoff{Initial: 50 * time.Millisecond, Max: 2 * time.Second, Multiplier: 2}
	for i := 1; ; i++ {
		err := f()
		if status.Code(err) != codes.Aborted || i == 5 {
			return err
		}
		if err := gax.Sleep(ctx, bo.Pause()); err != nil {
			return err
		}
	}
}
