package ledger

import (
	"context"
	"errors"
	"fmt"
	"github.com/relaybus/relaybus/internal/ledger/model"
	"sync"
	"time"

	"cloud.google.com/go/firestore"

	"github.com/relaybus/relaybus/internal/logging"
	"github.com/relaybus/relaybus/shared/event"
)

// RecordSent creates each event's document with status SENT, the topic's
// expected consumers (from the registry), sentAt = lastSentAt = the send's
// At, enqueuedAt, checkAt (the reconciler's turn) and deleteAt (the TTL).
// The relay calls it after Pub/Sub acknowledged the events, in the
// background: its consumers may report first, and the rollup then creates
// the document from their notices (Store.Fold) instead of waiting for it.
//
// It is idempotent. A document that already exists and records a send is
// left exactly as it is (a replayed RecordSent never downgrades a CONSUMED
// event). A document that exists but was never sent (the relay recorded
// publish failures first, or the rollup created it from its consumers'
// notices) gets the envelope, the send fields and the expected consumers,
// and its status is derived again from the truth table (markSent).
//
// The happy path costs one write per event and no read (creates go through
// a BulkWriter, 20 to a request); only documents that already exist are
// read, one read each. Attempts written as documents before the send
// whose notices could not be folded (notices of the former shape, which
// carry no attempts) are left to the reconciler, which the send makes due
// at checkAt. It returns every failure joined; events whose documents were
// written are done whatever the others did.
func (s *Store) RecordSent(ctx context.Context, sends []model.Sent) error {
	if len(sends) == 0 {
		return nil
	}
	var errs []error
	seen := make(map[string]bool, len(sends))
	batch := make([]*event.Event, 0, len(sends))
	sent := make(map[string]model.Sent, len(sends))
	for _, snd := range sends {
		e := snd.Event
		if e == nil {
			continue
		}
		if err := model.CheckEventID(e.ID); err != nil {
			errs = append(errs, fmt.Errorf("event %q: %w", e.ID, err))
			continue
		}
		if s.level(e.Topic) == model.LevelOff {
			continue
		}
		if !seen[e.ID] {
			seen[e.ID] = true
			batch = append(batch, e)
			snd.At, snd.EnqueuedAt = snd.At.UTC(), snd.EnqueuedAt.UTC()
			sent[e.ID] = snd
		}
	}
	expected, err := s.expectedFor(ctx, batch)
	if err != nil {
		return fmt.Errorf("ledger: record sent: %w", errors.Join(append(errs, err)...))
	}
	now := s.clock()
	bw := s.client.BulkWriter(ctx)
	type pending struct {
		e   *event.Event
		job *firestore.BulkWriterJob
	}
	jobs := make([]pending, 0, len(batch))
	for _, e := range batch {
		at := sent[e.ID].At
		d := s.sentEvent(sent[e.ID])
		d.Status, d.StatusAt = model.StatusSent, at
		d.SentAt, d.LastSentAt, d.EnqueuedAt = at, at, sent[e.ID].EnqueuedAt
		d.CreatedAt, d.UpdatedAt = now, now
		d.ExpectedConsumers = expected[e.Topic]
		d.CheckAt, d.DeleteAt = at.Add(s.reconcile), s.deleteAt(now)
		j, err := bw.Create(s.eventRef(e.ID), d)
		if err != nil {
			errs = append(errs, fmt.Errorf("event %s: %w", e.ID, err))
			continue
		}
		jobs = append(jobs, pending{e, j})
	}
	bw.End()
	var exist []*event.Event
	for _, p := range jobs {
		_, err := p.job.Results()
		switch {
		case err == nil:
		case alreadyExists(err):
			exist = append(exist, p.e)
		default:
			errs = append(errs, fmt.Errorf("event %s: %w", p.e.ID, err))
		}
	}
	// Documents created before the send (by the rollup, after a burst
	// the relay's recorder lags behind) are many at once: a few
	// transactions at a time.
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, markSenders)
	for _, e := range exist {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := s.markSent(ctx, e, expected[e.Topic], sent[e.ID]); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("event %s: %w", e.ID, err))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("ledger: record sent: %w", err)
	}
	return nil
}

// markSenders is how many sends RecordSent records at once on documents
// that exist already (each a transaction of one read and one write).
const markSenders = 16

// expectedFor looks up the expected consumers of every topic in the batch.
func (s *Store) expectedFor(ctx context.Context, events []*event.Event) (map[string][]string, error) {
	out := make(map[string][]string)
	for _, e := range events {
		if _, ok := out[e.Topic]; ok {
			continue
		}
		cs, err := s.reg.ExpectedConsumers(ctx, e.Topic)
		if err != nil {
			return nil, fmt.Errorf("expected consumers of %s: %w", e.Topic, err)
		}
		ids := make([]string, 0, len(cs))
		for _, c := range cs {
			ids = append(ids, c.ConsumerID)
		}
		out[e.Topic] = ids
	}
	return out, nil
}

// markSent records the send on a document that already exists: a
// document written before the send by the relay's publish failures, or by
// a fold that came first (model.StubEvent). One that records a send
// already is left exactly as it is. Otherwise the document is written
// anew in the transaction that read it: the envelope and the send fields
// from e, and what the document held of the event's story (its
// consumers' marks, re-push, publish failure, creation), with its status
// derived again. A document the fold wrote (Folded) holds its consumers'
// latest attempts in its marks, so it costs this one read; an older one
// has its attempts read too.
func (s *Store) markSent(ctx context.Context, e *event.Event, expected []string, snd model.Sent) error {
	at := snd.At
	ref := s.eventRef(e.ID)
	var healed, failed bool
	var prev, next model.Status
	err := s.client.RunTransaction(ctx, func(ctx context.Context, tx *firestore.Transaction) error {
		healed = false
		now := s.clock()
		full := s.sentEvent(snd)
		full.SentAt, full.LastSentAt, full.EnqueuedAt = at, at, snd.EnqueuedAt
		full.ExpectedConsumers = expected
		full.UpdatedAt = now
		snap, err := s.getDoc(ctx, tx, ref)
		if notFound(err) {
			// Gone since the create failed (deleted by hand): write it anew.
			full.Status, full.StatusAt, full.CreatedAt = model.StatusSent, at, now
			full.CheckAt, full.DeleteAt = at.Add(s.reconcile), s.deleteAt(now)
			return tx.Create(ref, full)
		}
		if err != nil {
			return err
		}
		var d model.Event
		if err := snap.DataTo(&d); err != nil {
			return fmt.Errorf("decode %s: %w", ref.ID, err)
		}
		if !d.SentAt.IsZero() {
			return nil // already recorded: leave it exactly as it is
		}
		var latest map[string]model.Attempt
		if d.Folded {
			latest = model.LatestByConsumer(model.WithFolded(&d, nil))
		} else {
			attempts, err := s.eventAttempts(ctx, tx, &d)
			if err != nil {
				return err
			}
			latest = model.LatestByConsumer(attempts)
		}
		// What the document holds of the event's story.
		full.Shard, full.Folded, full.Latest = d.Shard, d.Folded, d.Latest
		full.RetryCount, full.Repush, full.PublishFailure = d.RetryCount, d.Repush, d.PublishFailure
		full.CreatedAt, full.DeleteAt = d.CreatedAt, d.DeleteAt
		full.Status, full.StatusAt, full.CheckAt = d.Status, d.StatusAt, d.CheckAt
		if d.LastSentAt.After(at) {
			full.LastSentAt = d.LastSentAt
		}
		if full.EnqueuedAt.IsZero() {
			full.EnqueuedAt = d.EnqueuedAt
		}
		prev, next = d.Status, model.Derive(model.FactsOf(&full, latest, now))
		if next != full.Status {
			full.Status, full.StatusAt = next, at
		}
		switch {
		case next.Settled():
			full.CheckAt = time.Time{}
		case full.CheckAt.IsZero():
			full.CheckAt = at.Add(s.reconcile)
		}
		if !next.Open() {
			full.ExpireDue = time.Time{}
		}
		healed, failed = true, d.PublishFailure != nil
		return tx.Set(ref, full)
	})
	if err != nil {
		return err
	}
	switch {
	case healed && failed:
		s.log.InfoContext(ctx, "ledger: send recorded on an event first recorded by a publish failure",
			append(logging.Event(e), "previous_status", prev, "status", next)...)
	case healed:
		s.log.DebugContext(ctx, "ledger: send recorded on an event its consumers' notices recorded first",
			append(logging.Event(e), "previous_status", prev, "status", next)...)
	}
	return nil
}

// statusUpdates returns the updates that move d to status st (none when d
// already has it), keeping expireDue and checkAt in step: expireDue
// present while the event is open, absent once it is CONSUMED or EXPIRED;
// checkAt present while the status is not settled (the reconciler's next
// look, ReconcileAfter from now), absent once it is.
func (s *Store) statusUpdates(d *model.Event, st model.Status, now time.Time) []firestore.Update {
	var ups []firestore.Update
	switch {
	case !st.Settled() && d.CheckAt.IsZero():
		ups = append(ups, firestore.Update{Path: "checkAt", Value: now.Add(s.reconcile)})
	case st.Settled() && !d.CheckAt.IsZero():
		ups = append(ups, firestore.Update{Path: "checkAt", Value: firestore.Delete})
	}
	if d.Status == st {
		return ups
	}
	ups = append(ups, firestore.Update{Path: "status", Value: st}, firestore.Update{Path: "statusAt", Value: now})
	if !d.ExpireAt.IsZero() {
		switch {
		case st.Open() && d.ExpireDue.IsZero():
			ups = append(ups, firestore.Update{Path: "expireDue", Value: d.ExpireAt})
		case !st.Open() && !d.ExpireDue.IsZero():
			ups = append(ups, firestore.Update{Path: "expireDue", Value: firestore.Delete})
		}
	}
	return ups
}

// RecordPublishFailure records the relay's failure to publish an event:
// status PENDING with the error while a retry is scheduled, FAILED when
// final (the relay gave up). It creates the document when needed. Once an
// event has been sent, its status is the consumers' story: a failed
// re-publish is kept in publishFailure, and a final one settles an
// outstanding re-push (which will not arrive) so the status is derived
// without it.
func (s *Store) RecordPublishFailure(ctx context.Context, e *event.Event, attempts int, lastError string, final bool, at time.Time) error {
	if e == nil {
		return errors.New("ledger: record publish failure: nil event")
	}
	if err := model.CheckEventID(e.ID); err != nil {
		return fmt.Errorf("ledger: record publish failure: %w", err)
	}
	if s.level(e.Topic) == model.LevelOff {
		return nil
	}
	at = at.UTC()
	pf := &model.PublishFailure{Attempts: attempts, LastError: model.Truncate(lastError, model.MaxErrorText), At: at, Final: final}
	expected, err := s.expectedFor(ctx, []*event.Event{e})
	if err != nil {
		return fmt.Errorf("ledger: record publish failure of %s: %w", e.ID, err)
	}
	ref := s.eventRef(e.ID)
	err = s.client.RunTransaction(ctx, func(ctx context.Context, tx *firestore.Transaction) error {
		now := s.clock()
		snap, err := s.getDoc(ctx, tx, ref)
		if notFound(err) {
			// Consumers may have reported already (a publish that timed out
			// but went through): derive the status from their attempts.
			attempts, err := s.readAttempts(ctx, tx, e.ID)
			if err != nil {
				return err
			}
			d := model.NewEvent(e, s.maxPayload, s.shards)
			s.applyPrivacy(ctx, &d, e)
			d.PublishFailure = pf
			d.ExpectedConsumers = expected[e.Topic]
			d.CreatedAt, d.UpdatedAt = now, now
			d.Status, d.StatusAt = model.Derive(model.FactsOf(&d, model.LatestByConsumer(attempts), now)), at
			d.DeleteAt = s.deleteAt(now)
			if !d.Status.Open() {
				d.ExpireDue = time.Time{}
			}
			if !d.Status.Settled() {
				d.CheckAt = now.Add(s.reconcile)
			}
			return tx.Create(ref, d)
		}
		if err != nil {
			return err
		}
		var d model.Event
		if err := snap.DataTo(&d); err != nil {
			return fmt.Errorf("decode %s: %w", ref.ID, err)
		}
		ups := []firestore.Update{{Path: "publishFailure", Value: pf}, {Path: "updatedAt", Value: now}}
		d.PublishFailure = pf
		if final && d.Repush != nil && !d.Repush.PublishFailed {
			d.Repush.PublishFailed = true
			ups = append(ups, firestore.Update{Path: "repush.publishFailed", Value: true})
		}
		if d.SentAt.IsZero() || final {
			attempts, err := s.eventAttempts(ctx, tx, &d)
			if err != nil {
				return err
			}
			ups = append(ups, s.statusUpdates(&d, model.Derive(model.FactsOf(&d, model.LatestByConsumer(attempts), now)), now)...)
		}
		return tx.Update(ref, ups)
	})
	if err != nil {
		return fmt.Errorf("ledger: record publish failure of %s: %w", e.ID, err)
	}
	return nil
}

// sentEvent is the document of a send: its event's, with the size of a
// payload a sends notice left out (Sent.OmittedPayload).
func (s *Store) sentEvent(snd model.Sent) model.Event {
	d := model.NewEvent(snd.Event, s.maxPayload, s.shards)
	if snd.OmittedPayload > 0 && len(snd.Event.Payload) == 0 {
		d.PayloadSize, d.PayloadOmitted, d.Payload = snd.OmittedPayload, true, nil
	}
	s.applyPrivacy(context.Background(), &d, snd.Event)
	return d
}
