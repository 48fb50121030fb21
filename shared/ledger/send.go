package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"cloud.google.com/go/firestore"

	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/logging"
)

// RecordSent creates each event's document with status SENT, the topic's
// expected consumers (from the registry), sentAt = lastSentAt = the send's
// At, enqueuedAt, checkAt (the reconciler's turn) and deleteAt (the TTL).
// The relay calls it after Pub/Sub acknowledged the events, in the
// background: a consumer's attempt may reach the ledger first, and rollup
// then waits for the document (see Store.RollupMany and the reconciler).
//
// It is idempotent. A document that already exists and records a send is
// left exactly as it is (a replayed RecordSent never downgrades a CONSUMED
// event). A document that exists but was never sent (the relay recorded
// publish failures first) gets the send fields and the expected consumers,
// and its status is derived again from the truth table.
//
// The happy path costs one write per event and no read (creates go through
// a BulkWriter, 20 to a request); only documents that already exist are
// read, and events whose send is recorded more than 5 s after it happened
// (by the relay's healing step, after a crash) are rolled up at once, since
// their consumers may have reported before the document existed. It returns every failure joined; events whose documents were
// written are done whatever the others did.
func (s *Store) RecordSent(ctx context.Context, sends []Sent) error {
	if len(sends) == 0 {
		return nil
	}
	var errs []error
	seen := make(map[string]bool, len(sends))
	batch := make([]*event.Event, 0, len(sends))
	sent := make(map[string]Sent, len(sends))
	for _, snd := range sends {
		e := snd.Event
		if e == nil {
			continue
		}
		if err := checkEventID(e.ID); err != nil {
			errs = append(errs, fmt.Errorf("event %q: %w", e.ID, err))
			continue
		}
		if s.level(e.Topic) == LevelOff {
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
		d := newEvent(e, s.maxPayload, s.shards)
		d.Status, d.StatusAt = StatusSent, at
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
	s.wrote(OpRecordSent, len(jobs))
	var late []string
	for _, p := range jobs {
		_, err := p.job.Results()
		switch {
		case err == nil:
			if now.Sub(sent[p.e.ID].At) > lateSend {
				late = append(late, p.e.ID)
			}
		case alreadyExists(err):
			if err := s.markSent(ctx, p.e, expected[p.e.Topic], sent[p.e.ID]); err != nil {
				errs = append(errs, fmt.Errorf("event %s: %w", p.e.ID, err))
			}
		default:
			errs = append(errs, fmt.Errorf("event %s: %w", p.e.ID, err))
		}
	}
	// A send recorded late (after a crash, by the relay's healing step)
	// may find its consumers' attempts written already and their rollups
	// gone by without a document to write to: derive those events now
	// rather than leave them to the reconciler.
	if len(late) > 0 {
		rs, err := s.RollupMany(ctx, late)
		if err != nil {
			errs = append(errs, err)
		}
		for _, r := range rs {
			if r.Err != nil && !errors.Is(r.Err, ErrEventNotFound) {
				errs = append(errs, r.Err)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("ledger: record sent: %w", err)
	}
	return nil
}

// lateSend is how long after its send a send's record counts as late (see
// RecordSent): longer than the relay's live recorder takes.
const lateSend = 5 * time.Second

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

// markSent records the send on a document that already exists.
func (s *Store) markSent(ctx context.Context, e *event.Event, expected []string, snd Sent) error {
	at := snd.At
	ref := s.eventRef(e.ID)
	var writes int
	var healed bool
	var prev, next Status
	err := s.client.RunTransaction(ctx, func(ctx context.Context, tx *firestore.Transaction) error {
		writes, healed = 0, false
		snap, err := s.getDoc(ctx, OpRecordSent, tx, ref)
		if notFound(err) {
			// Gone since the create failed (deleted by hand): write it anew.
			d := newEvent(e, s.maxPayload, s.shards)
			now := s.clock()
			d.Status, d.StatusAt, d.SentAt, d.LastSentAt, d.EnqueuedAt = StatusSent, at, at, at, snd.EnqueuedAt
			d.CreatedAt, d.UpdatedAt, d.ExpectedConsumers = now, now, expected
			d.CheckAt, d.DeleteAt = at.Add(s.reconcile), s.deleteAt(now)
			writes = 1
			return tx.Create(ref, d)
		}
		if err != nil {
			return err
		}
		var d Event
		if err := snap.DataTo(&d); err != nil {
			return fmt.Errorf("decode %s: %w", ref.ID, err)
		}
		if !d.SentAt.IsZero() {
			return nil // already recorded: leave it exactly as it is
		}
		attempts, err := s.eventAttempts(ctx, OpRecordSent, tx, &d)
		if err != nil {
			return err
		}
		d.SentAt = at
		if at.After(d.LastSentAt) {
			d.LastSentAt = at
		}
		d.ExpectedConsumers = expected
		now := s.clock()
		prev, next = d.Status, Derive(factsOf(&d, latestByConsumer(attempts), now))
		ups := []firestore.Update{
			{Path: "sentAt", Value: d.SentAt},
			{Path: "lastSentAt", Value: d.LastSentAt},
			{Path: "expectedConsumers", Value: expected},
			{Path: "updatedAt", Value: now},
		}
		if !snd.EnqueuedAt.IsZero() {
			ups = append(ups, firestore.Update{Path: "enqueuedAt", Value: snd.EnqueuedAt})
		}
		ups = append(ups, s.statusUpdates(&d, next, at)...)
		writes, healed = 1, true
		return tx.Update(ref, ups)
	})
	if err != nil {
		return err
	}
	s.wrote(OpRecordSent, writes)
	if healed {
		s.log.InfoContext(ctx, "ledger: send recorded on an event first recorded by a publish failure",
			append(logging.Event(e), "previous_status", prev, "status", next)...)
	}
	return nil
}

// statusUpdates returns the updates that move d to status st (none when d
// already has it), keeping expireDue and checkAt in step: expireDue
// present while the event is open, absent once it is CONSUMED or EXPIRED;
// checkAt present while the status is not settled (the reconciler's next
// look, ReconcileAfter from now), absent once it is.
func (s *Store) statusUpdates(d *Event, st Status, now time.Time) []firestore.Update {
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
		case st.open() && d.ExpireDue.IsZero():
			ups = append(ups, firestore.Update{Path: "expireDue", Value: d.ExpireAt})
		case !st.open() && !d.ExpireDue.IsZero():
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
	if err := checkEventID(e.ID); err != nil {
		return fmt.Errorf("ledger: record publish failure: %w", err)
	}
	if s.level(e.Topic) == LevelOff {
		return nil
	}
	at = at.UTC()
	pf := &PublishFailure{Attempts: attempts, LastError: truncate(lastError, maxErrorText), At: at, Final: final}
	expected, err := s.expectedFor(ctx, []*event.Event{e})
	if err != nil {
		return fmt.Errorf("ledger: record publish failure of %s: %w", e.ID, err)
	}
	ref := s.eventRef(e.ID)
	var writes int
	err = s.client.RunTransaction(ctx, func(ctx context.Context, tx *firestore.Transaction) error {
		writes = 0
		now := s.clock()
		snap, err := s.getDoc(ctx, OpPublishFailure, tx, ref)
		if notFound(err) {
			// Consumers may have reported already (a publish that timed out
			// but went through): derive the status from their attempts.
			attempts, err := s.readAttempts(ctx, OpPublishFailure, tx, e.ID)
			if err != nil {
				return err
			}
			d := newEvent(e, s.maxPayload, s.shards)
			d.PublishFailure = pf
			d.ExpectedConsumers = expected[e.Topic]
			d.CreatedAt, d.UpdatedAt = now, now
			d.Status, d.StatusAt = Derive(factsOf(&d, latestByConsumer(attempts), now)), at
			d.DeleteAt = s.deleteAt(now)
			if !d.Status.open() {
				d.ExpireDue = time.Time{}
			}
			if !d.Status.Settled() {
				d.CheckAt = now.Add(s.reconcile)
			}
			writes = 1
			return tx.Create(ref, d)
		}
		if err != nil {
			return err
		}
		var d Event
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
			attempts, err := s.eventAttempts(ctx, OpPublishFailure, tx, &d)
			if err != nil {
				return err
			}
			ups = append(ups, s.statusUpdates(&d, Derive(factsOf(&d, latestByConsumer(attempts), now)), now)...)
		}
		writes = 1
		return tx.Update(ref, ups)
	})
	if err != nil {
		return fmt.Errorf("ledger: record publish failure of %s: %w", e.ID, err)
	}
	s.wrote(OpPublishFailure, writes)
	return nil
}
