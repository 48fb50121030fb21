package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"cloud.google.com/go/firestore"
	"github.com/googleapis/gax-go/v2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/relaybus/relaybus/shared/event"
)

// DefaultRollupTopic is the rollup topic when the topology names none.
const DefaultRollupTopic = "relaybus.ledger.rollup"

// Recorder is consume's ledger: it records consumption attempts and tells
// rollup about them.
type Recorder struct {
	store *Store
	pub   event.Publisher
	topic string
}

// NewRecorder returns a Recorder that inserts attempts into s and publishes
// rollup notices to topic (DefaultRollupTopic when empty) through pub.
func NewRecorder(s *Store, pub event.Publisher, topic string) *Recorder {
	if topic == "" {
		topic = DefaultRollupTopic
	}
	return &Recorder{store: s, pub: pub, topic: topic}
}

// RecordAttempts records a batch of committed attempts: it inserts as
// documents of their own (AttemptDocID: recording the same attempt again
// changes nothing) the attempts their topic's level keeps that way (at
// LevelFailures, every attempt but a consumer's first one that succeeded;
// at LevelFull all of them), then publishes rollup notices that carry
// every attempt (FoldMessage, MaxNoticeAttempts to a notice), from which
// the rollup folds each consumer's outcome into its event's document.
// Attempts of topics at LevelOff are dropped. Consume calls it after the
// attempts are committed in Postgres, in the background, in batches; when
// it fails nothing is lost: the attempts stay unshipped in Postgres and
// the scheduled shipping step records them again (every step is
// idempotent). A notice, once published, is the attempts' carrier: the
// rollup acknowledges it only once their outcomes are in the ledger (the
// rollup subscription has no dead-letter topic).
// Cost: one write per attempt kept as a document; none in the happy path
// at LevelFailures.
func (r *Recorder) RecordAttempts(ctx context.Context, as []Attempt) error {
	kept := make([]Attempt, 0, len(as))
	var docs []Attempt
	var errs []error
	now := r.store.clock()
	for _, a := range as {
		lvl := r.store.level(a.Topic)
		if lvl == LevelOff {
			continue
		}
		a, err := r.store.prepareAttempt(a, now)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		kept = append(kept, a)
		if lvl.keepsDocument(a) {
			docs = append(docs, a)
		}
	}
	if err := r.store.InsertAttempts(ctx, docs); err != nil {
		return errors.Join(append(errs, err)...)
	}
	for len(kept) > 0 {
		n := min(len(kept), MaxNoticeAttempts)
		if _, err := r.pub.Publish(ctx, r.topic, FoldMessage(kept[:n])); err != nil {
			return errors.Join(append(errs, fmt.Errorf("ledger: rollup notice for %d attempts to %s: %w", n, r.topic, err))...)
		}
		kept = kept[n:]
	}
	return errors.Join(errs...)
}

// InsertAttempts writes attempts into their events' event_consumptions
// unless they are there already, through one BulkWriter. Attempts are
// insert-only: an existing document is never changed. ConsumedAt defaults
// to now; CreatedAt is always now; an error message is cut to 4 KiB. It
// returns every failure joined; the attempts that were written are done.
// Cost: one write per attempt.
func (s *Store) InsertAttempts(ctx context.Context, as []Attempt) error {
	if len(as) == 0 {
		return nil
	}
	now := s.clock()
	var errs []error
	bw := s.client.BulkWriter(ctx)
	type job struct {
		ref *firestore.DocumentRef
		j   *firestore.BulkWriterJob
	}
	jobs := make([]job, 0, len(as))
	for _, a := range as {
		a, err := s.prepareAttempt(a, now)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		ref := s.attempts(a.EventID).Doc(AttemptDocID(a.EventID, a.ConsumerID, a.AttemptNo))
		j, err := bw.Create(ref, a)
		if err != nil {
			errs = append(errs, fmt.Errorf("ledger: attempt %s: %w", ref.ID, err))
			continue
		}
		jobs = append(jobs, job{ref, j})
	}
	bw.End()
	s.wrote(OpRecordAttempt, len(jobs))
	for _, j := range jobs {
		if _, err := j.j.Results(); err != nil && !alreadyExists(err) {
			errs = append(errs, fmt.Errorf("ledger: attempt %s: %w", j.ref.ID, err))
		}
	}
	return errors.Join(errs...)
}

// prepareAttempt fills and checks an attempt before it is written.
func (s *Store) prepareAttempt(a Attempt, now time.Time) (Attempt, error) {
	if a.ConsumedAt.IsZero() {
		a.ConsumedAt = now
	}
	a.ConsumedAt = a.ConsumedAt.UTC()
	a.CreatedAt = now
	a.DeleteAt = s.deleteAt(now)
	a.ErrorMessage = truncate(a.ErrorMessage, maxErrorText)
	if err := a.Validate(); err != nil {
		return a, fmt.Errorf("ledger: attempt of %s by %s: %w", a.EventID, a.ConsumerID, err)
	}
	return a, nil
}

// InsertAttempt writes one attempt unless it is there already (created
// reports which). Cost: one write.
func (s *Store) InsertAttempt(ctx context.Context, a Attempt) (created bool, err error) {
	a, err = s.prepareAttempt(a, s.clock())
	if err != nil {
		return false, err
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

// retryAborted runs f again while Firestore answers ABORTED (a write that
// waited too long for another transaction's locks), a few times.
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
