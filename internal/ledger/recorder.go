package ledger

import (
	"context"
	"errors"
	"fmt"
	"github.com/relaybus/relaybus/internal/ledger/model"
	"time"

	"cloud.google.com/go/firestore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/relaybus/relaybus/internal/retry"
	"github.com/relaybus/relaybus/shared/event"
)

// DefaultRollupTopic is the rollup topic when the topology names none.
const DefaultRollupTopic = "relaybus.ledger.rollup"

// Recorder is consume's ledger: it tells the rollup about consumption
// attempts through the rollup topic, and needs no Firestore: the rollup
// writes what the notices carry (Store.Fold), so a consumer's identity
// holds no grant on the ledger's database and can neither read the
// ledger's payloads nor write anything in it but through the rollup
// (SendNotifier does the same for the sends of its child events).
type Recorder struct {
	pub    event.Publisher
	topic  string
	levels map[string]model.Level
	now    func() time.Time
}

// RecorderOptions configure a Recorder. Every field is optional.
type RecorderOptions struct {
	// Topic is the rollup topic (DefaultRollupTopic).
	Topic string
	// Levels are the topics' ledger levels (model.LevelsOf; a topic not
	// in it has model.DefaultLevel): attempts of LevelOff topics are
	// dropped.
	Levels map[string]model.Level
	// Now stamps attempts without a ConsumedAt (time.Now).
	Now func() time.Time
}

// NewRecorder returns a Recorder that publishes rollup notices through
// pub.
func NewRecorder(pub event.Publisher, o RecorderOptions) *Recorder {
	if o.Topic == "" {
		o.Topic = DefaultRollupTopic
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Recorder{pub: pub, topic: o.Topic, levels: o.Levels, now: o.Now}
}

// RecordAttempts records a batch of committed attempts: it publishes
// rollup notices that carry every attempt (FoldMessage, MaxNoticeAttempts
// to a notice, error messages cut to model.MaxErrorText), from which the
// rollup inserts as documents of their own the attempts their topic's
// level keeps that way and folds each consumer's outcome into its event's
// document (Store.Fold). Attempts of topics at LevelOff are dropped.
// Consume calls it after the attempts are committed in Postgres, in the
// background, in batches; when it fails nothing is lost: the attempts stay
// unshipped in Postgres and the scheduled shipping step records them again
// (every step is idempotent). A notice, once published, is the attempts'
// carrier: the rollup acknowledges it only once they are in the ledger
// (the rollup subscription has no dead-letter topic). Cost: no Firestore
// operation; one Pub/Sub message per 500 attempts.
func (r *Recorder) RecordAttempts(ctx context.Context, as []model.Attempt) error {
	kept := make([]model.Attempt, 0, len(as))
	var errs []error
	now := r.now().UTC()
	for _, a := range as {
		if l, ok := r.levels[a.Topic]; ok && l == model.LevelOff {
			continue
		}
		if a.ConsumedAt.IsZero() {
			a.ConsumedAt = now
		}
		a.ConsumedAt = a.ConsumedAt.UTC()
		a.ErrorMessage = model.Truncate(a.ErrorMessage, model.MaxErrorText)
		if err := a.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("ledger: attempt of %s by %s: %w", a.EventID, a.ConsumerID, err))
			continue
		}
		kept = append(kept, a)
	}
	for len(kept) > 0 {
		n := min(len(kept), model.MaxNoticeAttempts)
		if _, err := r.pub.Publish(ctx, r.topic, model.FoldMessage(kept[:n])); err != nil {
			return errors.Join(append(errs, fmt.Errorf("ledger: rollup notice for %d attempts to %s: %w", n, r.topic, err))...)
		}
		kept = kept[n:]
	}
	return errors.Join(errs...)
}

// SendNotifier is the relay ledger (relay.Ledger) of a relay whose
// identity may not write the ledger: consume's kicker of its handlers'
// child events. It hands the sends to the rollup as sends notices
// (model.SendsMessages), which the rollup records (Store.RecordSent) as
// the relay's own recorder would, and sets them recorded once the notice
// is published: Pub/Sub keeps a notice until the rollup has recorded it.
// A notice that cannot be published leaves the sends to the relay
// function's healing step, which drains the same outbox with the ledger.
// Publish failures are the relay function's to record too: a kick that
// fails leaves the run to its next drain, which records what it sees.
type SendNotifier struct {
	pub   event.Publisher
	topic string
}

// NewSendNotifier returns a SendNotifier publishing to topic
// (DefaultRollupTopic when empty).
func NewSendNotifier(pub event.Publisher, topic string) *SendNotifier {
	if topic == "" {
		topic = DefaultRollupTopic
	}
	return &SendNotifier{pub: pub, topic: topic}
}

// RecordSent publishes the sends as sends notices. Cost: no Firestore
// operation; one Pub/Sub message per 8 MiB of sends.
func (n *SendNotifier) RecordSent(ctx context.Context, sends []model.Sent) error {
	msgs, err := model.SendsMessages(sends)
	if err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	for _, m := range msgs {
		if _, err := n.pub.Publish(ctx, n.topic, m); err != nil {
			return fmt.Errorf("ledger: sends notice to %s: %w", n.topic, err)
		}
	}
	return nil
}

// RecordPublishFailure records nothing: the relay function's drain of the
// same outbox records the failures it meets (see SendNotifier).
func (n *SendNotifier) RecordPublishFailure(context.Context, *event.Event, int, string, bool, time.Time) error {
	return nil
}

// keptAttempts returns the notices' attempts that their topics' levels
// keep as documents of their own (Store.Fold inserts them).
func (s *Store) keptAttempts(notices []model.Notice) []model.Attempt {
	var out []model.Attempt
	for _, n := range notices {
		for _, a := range n.Attempts {
			if lvl := s.level(a.Topic); lvl != model.LevelOff && lvl.KeepsDocument(a) {
				out = append(out, a)
			}
		}
	}
	return out
}

// InsertAttempts writes attempts into their events' event_consumptions
// unless they are there already, through one BulkWriter. Attempts are
// insert-only: an existing document is never changed. ConsumedAt defaults
// to now; CreatedAt is always now; an error message is cut to 4 KiB. It
// returns every failure joined; the attempts that were written are done.
// Cost: one write per attempt.
func (s *Store) InsertAttempts(ctx context.Context, as []model.Attempt) error {
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
	for _, in := range as {
		a, err := s.prepareAttempt(in, now)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		ref := s.attempts(a.EventID).Doc(model.AttemptDocID(a.EventID, a.ConsumerID, a.AttemptNo))
		j, err := bw.Create(ref, a)
		if err != nil {
			errs = append(errs, fmt.Errorf("ledger: attempt %s: %w", ref.ID, err))
			continue
		}
		jobs = append(jobs, job{ref, j})
	}
	bw.End()
	for _, j := range jobs {
		if _, err := j.j.Results(); err != nil && !alreadyExists(err) {
			errs = append(errs, fmt.Errorf("ledger: attempt %s: %w", j.ref.ID, err))
		}
	}
	return errors.Join(errs...)
}

// prepareAttempt fills and checks an attempt before it is written.
func (s *Store) prepareAttempt(a model.Attempt, now time.Time) (model.Attempt, error) {
	if a.ConsumedAt.IsZero() {
		a.ConsumedAt = now
	}
	a.ConsumedAt = a.ConsumedAt.UTC()
	a.CreatedAt = now
	a.DeleteAt = s.deleteAt(now)
	a.ErrorMessage = model.Truncate(a.ErrorMessage, model.MaxErrorText)
	if err := a.Validate(); err != nil {
		return a, fmt.Errorf("ledger: attempt of %s by %s: %w", a.EventID, a.ConsumerID, err)
	}
	return a, nil
}

// InsertAttempt writes one attempt unless it is there already (created
// reports which). Cost: one write.
func (s *Store) InsertAttempt(ctx context.Context, a model.Attempt) (created bool, err error) {
	a, err = s.prepareAttempt(a, s.clock())
	if err != nil {
		return false, err
	}
	ref := s.attempts(a.EventID).Doc(model.AttemptDocID(a.EventID, a.ConsumerID, a.AttemptNo))
	err = retryAborted(ctx, func() error {
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

// abortedBackoff spaces the retries of a write Firestore aborted: 50 ms
// doubling to 2 s, ±20% jitter (retry.Policy), five tries in all.
var abortedBackoff = retry.Policy{Initial: 50 * time.Millisecond, Max: 2 * time.Second}

// retryAborted runs f again while Firestore answers ABORTED (a write that
// waited too long for another transaction's locks), a few times.
func retryAborted(ctx context.Context, f func() error) error {
	for i := 1; ; i++ {
		err := f()
		if status.Code(err) != codes.Aborted || i == 5 {
			return err
		}
		if err := retry.Sleep(ctx, abortedBackoff.Delay(i)); err != nil {
			return err
		}
	}
}
