package ledger

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"cloud.google.com/go/firestore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/relaybus/relaybus/internal/ledger/internal/fsdoc"
	"github.com/relaybus/relaybus/internal/ledger/model"
	"github.com/relaybus/relaybus/internal/telemetry"
)

// RollupResult says what Rollup found and did.
type RollupResult struct {
	EventID string
	// Previous is the status before; Status the status after.
	Previous, Status model.Status
	// Changed is true when this call wrote the new status.
	Changed bool
	// Coalesced is true when this call shared a run started for another
	// concurrent call of the same event (see Rollup); the run's write, if
	// any, is reported as Changed to that call alone, so a status change is
	// reported (and logged) once.
	Coalesced bool
	// Expected, Reported and Succeeded count the expected consumers, those
	// that made at least one attempt, and those whose latest succeeded.
	Expected, Reported, Succeeded int
	// Event is the event's document, without its payload.
	Event model.Event
	// LastCommit is when the newest of the consumers' latest attempts
	// the status was derived from was committed (zero when none): with a
	// final status, the start of the hop "consumer commit → final status".
	LastCommit time.Time
	// Err is this event's failure in a RollupMany (model.ErrEventNotFound when
	// its document does not exist yet).
	Err error `json:"-"`
}

// Rollup derives one event's status (see RollupMany). Within one process,
// concurrent rollups of the same event are coalesced: while one runs, the
// callers that arrive share a single follow-up run that starts after it,
// so every caller gets a result derived from reads that began after its
// call, and a status change is reported (Changed) to one caller only. It
// fails with model.ErrEventNotFound when the event's document does not exist
// (yet).
func (s *Store) Rollup(ctx context.Context, eventID string) (RollupResult, error) {
	if err := model.CheckEventID(eventID); err != nil {
		return RollupResult{}, fmt.Errorf("ledger: rollup: %w", err)
	}
	return s.flights.do(ctx, eventID, func(ctx context.Context) (RollupResult, error) {
		rs, err := s.RollupMany(ctx, []string{eventID})
		if err != nil {
			return RollupResult{EventID: eventID}, err
		}
		return rs[0], rs[0].Err
	})
}

// rollupRounds bounds how often RollupMany derives an event again after
// another writer changed its document under it.
const rollupRounds = 5

// rollupReaders is how many events' attempts RollupMany reads at once.
const rollupReaders = 16

// RollupMany derives the status of each event from the latest attempt of
// each of its expected consumers (the truth table in the package
// documentation) and writes the statuses that changed, in one batch. It
// reads the events' documents in one request, then, in one more request,
// the attempts numbered after each consumer's mark in the document
// (Event.Latest), by document id: no query, because the Firestore
// emulator answers a query by scanning its whole store (measured: an
// event's attempts took 4 ms of emulator CPU with 6,000 documents stored
// and 25 ms with 100,000, a read by id 0.3 ms either way), which made
// rollups the local stack's bottleneck. It writes each changed status,
// with the marks that moved, with a precondition on the document's update
// time, through one BulkWriter: no transaction, so no locks for attempt
// inserts to wait on. A write whose document changed since it was read
// (another rollup, a send, a re-push) is derived again from fresh reads.
// That keeps concurrent rollups right: each notice is published after its
// attempt is written, so the rollup it triggers reads that attempt, and
// whichever rollup writes last had read the document as the one before it
// left it.
//
// It returns one result per id, in order; an event whose document does not
// exist (yet) has Err model.ErrEventNotFound, one that failed otherwise its
// error. The error is for failures of the whole batch.
//
// Cost per event: one read for the document, attemptWindow reads per
// expected consumer (found or not), one write when the status changes.
func (s *Store) RollupMany(ctx context.Context, eventIDs []string) ([]RollupResult, error) {
	ns := make([]model.Notice, len(eventIDs))
	for i, id := range eventIDs {
		ns[i] = model.Notice{EventID: id, Legacy: true}
	}
	return s.Fold(ctx, ns, 0)
}

// Fold is the rollup of notices that carry their attempts (FoldMessage):
// it first inserts the attempts whose topic's level keeps them as
// documents of their own (InsertAttempts: one write each, none in the
// happy path at LevelFailures), then reads each event's document (one
// read), folds each consumer's
// reported attempt into the document's Latest marks when it is newer than
// the one there, derives the status, and writes the marks that moved and
// the status in one write, with a precondition on the document's update
// time (a document changed in between is read and folded again). No
// attempt is read back: in the happy path an event costs one read and one
// write here whatever its number of consumers, as long as their notices
// reach one Fold (the rollup function holds an event for a window to
// gather them). A Notice marked Legacy (an id without its attempts) has
// its attempts read by document id as RollupMany does.
//
// gap is the least time between two writes of one event's document: a
// write due sooner after the document's last update waits (at most gap,
// once per batch), so that no event document is written more than once a
// second in steady state (Firestore's sustained limit per document, see
// https://firebase.google.com/docs/firestore/best-practices). Zero waits
// for nothing.
//
// An event whose document does not exist yet (its send is recorded in
// the background and may come after its consumers' notices) gets it
// created from the notices (see stub): the fold never waits for the send,
// and the send fills the envelope in when it comes (RecordSent). That
// order costs one more read and write than the usual one (the send reads
// the document it finds there).
//
// Results and errors are as RollupMany's, one per notice, in order; an
// event whose document does not exist and whose notices cannot create it
// (no attempts, no topic, or a topic at LevelOff) has Err
// model.ErrEventNotFound and nothing is written for it.
func (s *Store) Fold(ctx context.Context, notices []model.Notice, gap time.Duration) ([]RollupResult, error) {
	out := make([]RollupResult, len(notices))
	// The attempts kept as documents of their own first (consume writes
	// nothing in Firestore): a fold that fails here is retried whole.
	if err := s.InsertAttempts(ctx, s.keptAttempts(notices)); err != nil {
		for i, n := range notices {
			out[i] = RollupResult{EventID: n.EventID, Err: err}
		}
		return out, fmt.Errorf("ledger: rollup: attempts: %w", err)
	}
	at := map[string][]int{} // id -> its positions in notices
	byID := map[string]*model.Notice{}
	var todo []string
	for i, n := range notices {
		id := n.EventID
		out[i].EventID = id
		if err := model.CheckEventID(id); err != nil {
			out[i].Err = fmt.Errorf("ledger: rollup: %w", err)
			continue
		}
		m, dup := byID[id]
		if !dup {
			todo = append(todo, id)
			m = &model.Notice{EventID: id}
			byID[id] = m
		}
		m.Attempts = append(m.Attempts, n.Attempts...)
		m.Legacy = m.Legacy || n.Legacy || len(n.Attempts) == 0
		at[id] = append(at[id], i)
	}
	set := func(id string, r RollupResult) {
		for n, i := range at[id] {
			r.Changed = r.Changed && n == 0 // a change is reported once
			out[i] = r
		}
	}
	for round := 0; len(todo) > 0; round++ {
		if round == rollupRounds {
			for _, id := range todo {
				set(id, RollupResult{EventID: id, Err: fmt.Errorf("ledger: rollup %s: its document kept changing under %d rollups", id, rollupRounds)})
			}
			break
		}
		again, err := s.rollupRound(ctx, todo, set, false, byID, gap)
		if err != nil {
			return out, fmt.Errorf("ledger: rollup: %w", err)
		}
		todo = again
	}
	return out, nil
}

// derivation is one event read and derived by a rollup round.
type derivation struct {
	id   string
	snap *firestore.DocumentSnapshot
	ev   model.Event
	// latest holds each consumer's latest attempt, as read by the round.
	latest map[string]model.Attempt
	// readAll is set when the event's attempts must be read by a query.
	readAll bool
	// window is set when the attempts after each mark are read by id (a
	// legacy notice); fold holds the attempts the notices carried.
	window bool
	fold   []model.Attempt
	res    RollupResult
	ups    []firestore.Update
	// create is set when the event's document does not exist yet and the
	// fold creates it (a stub: see stub); ev is then the whole document.
	create bool
	job    *firestore.BulkWriterJob
}

// attemptWindow is how many attempts past each expected consumer's
// Event.Latest mark a rollup reads by document id. A consumer that filled
// the window may have more: that event's attempts are then read whole.
const attemptWindow = 2

// rollupRound reads, derives and writes the given events once, reports
// each settled result through set and returns the ids to derive again
// (their documents changed under the write). The attempts after each
// consumer's Latest mark are read by id, in one request for the whole
// round (the notices' own attempts need no read), and an event's attempts
// are read whole by a query only when a window came back full. With bump
// (the reconciler), they are also read whole when the document predates
// the fold or the event has been open longer than wholeReadAfter, and an
// event that is still not settled gets its next checkAt.
//
// Why the reconciler does not read every due event whole: that is a query
// per event, and the Firestore emulator answers a query by scanning every
// document it holds (250 ms at 95,000 events under load), so a local
// stack that fell ReconcileAfter behind scanned once per lagging event
// and fell further behind. Production Firestore serves the query from an
// index, but it is still a request per event where windows are one per
// batch.
func (s *Store) rollupRound(ctx context.Context, ids []string, set func(string, RollupResult), bump bool, notices map[string]*model.Notice, gap time.Duration) ([]string, error) {
	refs := make([]*firestore.DocumentRef, len(ids))
	for i, id := range ids {
		refs[i] = s.eventRef(id)
	}
	snaps, err := s.getAll(ctx, refs)
	if err != nil {
		return nil, err
	}
	ds := make([]*derivation, len(ids))
	now := s.clock()
	for i, id := range ids {
		d := &derivation{id: id, snap: snaps[i], res: RollupResult{EventID: id}, window: true}
		if n := notices[id]; n != nil {
			d.fold, d.window = n.Attempts, n.Legacy
		}
		ds[i] = d
		if !d.snap.Exists() {
			d.res.Err = fmt.Errorf("%w: %s", model.ErrEventNotFound, id)
			if !bump {
				if err := s.stub(ctx, d); err != nil {
					return nil, err
				}
			}
		} else if err := d.snap.DataTo(&d.ev); err != nil {
			d.res.Err = fmt.Errorf("ledger: rollup: decode %s: %w", d.snap.Ref.ID, err)
		}
		switch {
		case bump:
			// The reconciler reads by id the attempts after each mark. It
			// reads whole a document written before the fold, whose marks
			// may not record every attempt, and an event open for long
			// (wholeReadAfter): the safety net for an attempt a window
			// cannot reach, at a few looks an hour.
			whole := !d.ev.Folded || s.openFor(&d.ev, now) >= wholeReadAfter*s.reconcile
			d.window, d.readAll = !whole, whole
		default:
			// A document written before the fold may have attempt
			// documents no mark records (a first success that changed no
			// status): read them by id, as the former rollup did.
			d.window = d.window || !d.ev.Folded
		}
	}
	if err := s.readNewAttempts(ctx, ds); err != nil {
		return nil, err
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, rollupReaders)
	for _, d := range ds {
		if d.res.Err != nil || !d.readAll {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			attempts, err := s.readAttempts(ctx, nil, d.id)
			if err != nil {
				d.res.Err = fmt.Errorf("ledger: rollup %s: %w", d.id, err)
				return
			}
			d.latest = model.LatestByConsumer(model.WithFolded(&d.ev, attempts))
		}()
	}
	wg.Wait()
	now = s.clock()
	var wait time.Duration
	for _, d := range ds {
		if d.res.Err != nil {
			continue
		}
		for _, a := range d.fold {
			if cur, ok := d.latest[a.ConsumerID]; !ok || a.AttemptNo > cur.AttemptNo {
				d.latest[a.ConsumerID] = a
			}
		}
		s.derive(d, now, bump)
		if len(d.ups) > 0 && gap > 0 {
			wait = max(wait, min(time.Until(d.snap.UpdateTime.Add(gap)), gap))
		}
	}
	if wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
	}
	writes := 0
	for _, d := range ds {
		if d.res.Err == nil && (len(d.ups) > 0 || d.create) {
			writes++
		}
	}
	// The round's writes are a span of their own (under the rollup's fold
	// or the reconciler's), one whatever their number.
	_, span := telemetry.Start(ctx, "ledger write", telemetry.KindClient, "", telemetry.KeyBatchCount.Int(writes))
	defer span.End(nil)
	bw := s.client.BulkWriter(ctx)
	for _, d := range ds {
		if d.res.Err != nil || len(d.ups) == 0 && !d.create {
			continue
		}
		var j *firestore.BulkWriterJob
		var err error
		if d.create {
			j, err = bw.Create(d.snap.Ref, d.ev)
		} else {
			j, err = bw.Update(d.snap.Ref, d.ups, firestore.LastUpdateTime(d.snap.UpdateTime))
		}
		if err != nil {
			d.res.Err = err
			continue
		}
		d.job = j
	}
	bw.End()
	var again []string
	for _, d := range ds {
		if d.job != nil {
			switch _, err := d.job.Results(); {
			case err == nil:
				d.res.Changed = d.res.Status != d.res.Previous
				d.res.Event.Status = d.res.Status
			case status.Code(err) == codes.FailedPrecondition, d.create && alreadyExists(err):
				// Changed since it was read, or created since (its send was
				// recorded meanwhile): read and fold it again.
				again = append(again, d.id)
				continue
			default:
				d.res.Err = fmt.Errorf("ledger: rollup %s: %w", d.id, err)
			}
		}
		set(d.id, d.res)
	}
	return again, nil
}

// readNewAttempts fills each derivation's latest from its document's
// Latest marks and the attempts numbered after them, which it reads by
// document id (attemptWindow per expected consumer) in one GetAll for all
// of them: no query, so a rollup costs the same however many events and
// attempts the ledger holds. A derivation whose window came back full is
// marked readAll. Attempt numbers count from 1 without gaps (the inbox's
// counter), and a consumer's first success is the only attempt that may
// have no document (LevelFailures), so a window misses an attempt only
// when a consumer the event does not expect reported it, or two attempts
// in a row have no document, and the notices that carried them were lost
// too; the rollup acknowledges a notice only once it is folded.
func (s *Store) readNewAttempts(ctx context.Context, ds []*derivation) error {
	type slot struct {
		d        *derivation
		consumer string
	}
	var refs []*firestore.DocumentRef
	var slots []slot
	for _, d := range ds {
		if d.res.Err != nil {
			continue
		}
		d.latest = make(map[string]model.Attempt, len(d.ev.Latest))
		for c, m := range d.ev.Latest {
			d.latest[c] = m.Attempt(&d.ev, c)
		}
		if !d.window {
			continue
		}
		for _, c := range d.ev.ExpectedConsumers {
			from := d.ev.Latest[c].AttemptNo
			for n := from + 1; n <= from+attemptWindow; n++ {
				refs = append(refs, s.attempts(d.id).Doc(model.AttemptDocID(d.id, c, n)))
				slots = append(slots, slot{d, c})
			}
		}
	}
	snaps, err := s.getAll(ctx, refs)
	if err != nil {
		return fmt.Errorf("read attempts: %w", err)
	}
	found := make(map[slot]int)
	for i, snap := range snaps {
		if !snap.Exists() {
			continue
		}
		sl := slots[i]
		var a model.Attempt
		if err := snap.DataTo(&a); err != nil {
			sl.d.res.Err = fmt.Errorf("ledger: rollup: decode attempt %s: %w", snap.Ref.ID, err)
			continue
		}
		found[sl]++
		if cur, ok := sl.d.latest[sl.consumer]; !ok || a.AttemptNo > cur.AttemptNo {
			sl.d.latest[sl.consumer] = a
		}
	}
	for sl, n := range found {
		if n == attemptWindow {
			sl.d.readAll = true
		}
	}
	return nil
}

// derive derives an event's status from its document and the latest
// attempts read, leaving the updates to write (none when nothing changes):
// the status, and the Latest marks that moved.
func (s *Store) derive(d *derivation, now time.Time, bump bool) {
	ev := &d.ev
	f := model.FactsOf(ev, d.latest, now)
	st := model.Derive(f)
	d.res.Previous, d.res.Status = ev.Status, st
	d.res.Expected, d.res.Reported, d.res.Succeeded = model.Counts(f)
	ups := s.statusUpdates(ev, st, now)
	if bump && !st.Settled() {
		ups = append(withoutPath(ups, "checkAt"), firestore.Update{Path: "checkAt", Value: now.Add(s.recheckAfter(ev, now))})
	}
	// The marks that moved are written with a status change, or on their
	// own when a window came back full (so the next rollup need not read
	// the attempts whole again); a consumer's first success while another
	// has not reported changes no status and costs no write: the next
	// rollup's window still holds that attempt.
	if len(ups) > 0 || d.readAll || len(d.fold) > 0 {
		for c, a := range d.latest {
			if m := a.Mark(); !ev.Latest[c].SameAttempt(m) {
				ups = append(ups, firestore.Update{FieldPath: firestore.FieldPath{"latest", c}, Value: m})
			}
		}
	}
	if d.create {
		// The stub is written whole: the status, the marks, checkAt.
		ev.Status, ev.StatusAt = st, now
		ev.CreatedAt, ev.UpdatedAt, ev.DeleteAt = now, now, s.deleteAt(now)
		if !st.Settled() {
			ev.CheckAt = now.Add(s.reconcile)
		}
		ev.Latest = make(map[string]model.AttemptMark, len(d.latest))
		for c, a := range d.latest {
			ev.Latest[c] = a.Mark()
		}
		ups = nil
	}
	if len(ups) > 0 {
		d.ups = append(ups, firestore.Update{Path: "updatedAt", Value: now})
	}
	for _, a := range d.latest {
		if a.ConsumedAt.After(d.res.LastCommit) {
			d.res.LastCommit = a.ConsumedAt
		}
	}
	res := *ev
	res.Payload = nil // not needed past here; keep results small
	d.res.Event = res
}

// stub prepares the document a fold creates for an event that is not in
// the ledger yet (model.StubEvent), when the notices carry its consumers'
// attempts: the relay records sends in the background and, after a burst
// or a crash, may record one long after its consumers reported; waiting
// for it (the notice refused and redelivered on the rollup subscription's
// backoff, 1 s to 60 s) left the ledger a minute or more behind. The stub
// has the topic's expected consumers (the registry, as RecordSent reads
// it) and the folded outcomes; the send, when recorded, adds the envelope
// and the send fields (markSent). A notice without attempts (the former
// shape), without a topic, or of a topic whose level is off leaves the
// event not found, as before.
func (s *Store) stub(ctx context.Context, d *derivation) error {
	if len(d.fold) == 0 || d.window {
		return nil
	}
	topic := d.fold[0].Topic
	if topic == "" || s.level(topic) == model.LevelOff {
		return nil
	}
	cs, err := s.reg.ExpectedConsumers(ctx, topic)
	if err != nil {
		return fmt.Errorf("expected consumers of %s: %w", topic, err)
	}
	ids := make([]string, len(cs))
	for i, c := range cs {
		ids[i] = c.ConsumerID
	}
	d.ev = model.StubEvent(d.id, topic, ids, s.shards)
	d.create, d.res.Err = true, nil
	return nil
}

// recheckAfter is how long the reconciler waits before it looks at an
// event again that is still not settled: as long as the event has been
// around (so an event is looked at a handful of times a day at most),
// between ReconcileAfter and an hour.
func (s *Store) recheckAfter(ev *model.Event, now time.Time) time.Duration {
	return min(max(s.openFor(ev, now), s.reconcile), time.Hour)
}

// openFor is how long ev has been open at now: since it was sent, or
// since its document was created when its send is not recorded.
func (s *Store) openFor(ev *model.Event, now time.Time) time.Duration {
	since := ev.SentAt
	if since.IsZero() {
		since = ev.CreatedAt
	}
	return now.Sub(since)
}

// wholeReadAfter is, in ReconcileAfters, how long an event is open before
// the reconciler reads its attempts whole at each look (10 minutes in
// production, 150 s on the local stack): its first looks read the windows
// after the marks, which cost one request for a whole batch of events,
// where a whole read is a query per event.
const wholeReadAfter = 10

func withoutPath(ups []firestore.Update, path string) []firestore.Update {
	out := ups[:0:0]
	for _, u := range ups {
		if u.Path != path {
			out = append(out, u)
		}
	}
	return out
}

// DefaultReconcileBatch is how many events Reconcile looks at per call
// when given no limit.
const DefaultReconcileBatch = 500

// ReconcileReport says what Reconcile did.
type ReconcileReport struct {
	// Due is how many events were due for a look (checkAt passed).
	Due int `json:"due"`
	// Changed is how many got a new status; Settled how many of those are
	// now settled (CONSUMED, EXPIRED, FAILED).
	Changed int `json:"changed"`
	Settled int `json:"settled"`
	// More is true when the batch was full: call again.
	More bool `json:"more"`
}

// Reconcile derives again the status of events whose status is not
// settled and whose checkAt has passed: the rollup of an event whose
// notice was lost, or whose send reached the ledger after its attempts,
// happens here. Each event that is still not settled gets its next look
// further out (recheckAfter), so long-waiting events cost a few reads a
// day. It reads the reconciler's index (shard, checkAt), which holds only
// events that are not settled, up to limit of them (DefaultReconcileBatch
// when <= 0). It is idempotent; the rollup function serves it at POST
// /reconcile for Cloud Scheduler.
func (s *Store) Reconcile(ctx context.Context, limit int) (ReconcileReport, error) {
	if limit <= 0 {
		limit = DefaultReconcileBatch
	}
	now := s.clock()
	q := fsdoc.ShapeCheckDue.Query(s.events.Query, nil)
	q = fsdoc.ShapeCheckDue.WithRange(q, nil, now.Add(time.Microsecond)).Select("eventId").Limit(limit)
	docs, err := s.queryDocs(ctx, nil, q)
	if err != nil {
		return ReconcileReport{}, fmt.Errorf("ledger: reconcile: %w", err)
	}
	rep := ReconcileReport{Due: len(docs), More: len(docs) == limit}
	var ids []string
	for _, d := range docs {
		if id, _ := d.Data()["eventId"].(string); id != "" {
			ids = append(ids, id)
		}
	}
	var errs []error
	set := func(id string, r RollupResult) {
		switch {
		case r.Err != nil && !errors.Is(r.Err, model.ErrEventNotFound):
			errs = append(errs, r.Err)
		case r.Changed:
			rep.Changed++
			if r.Status.Settled() {
				rep.Settled++
				recordSettled(ctx, r, s.clock())
			}
		}
	}
	for round := 0; len(ids) > 0 && round < rollupRounds; round++ {
		if ids, err = s.rollupRound(ctx, ids, set, true, nil, 0); err != nil {
			return rep, fmt.Errorf("ledger: reconcile: %w", err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return rep, fmt.Errorf("ledger: reconcile: %w", err)
	}
	return rep, nil
}

// recordSettled records the hop "consumer commit → final status"
// (relaybus.hop.duration, commit_to_status) of an event the reconciler or
// the expiry sweep just gave a settled status, from the newest consumer
// commit it was derived from (none: nothing to measure) to now, just
// after the write. The rollup function records its folds' the same way.
func recordSettled(ctx context.Context, r RollupResult, now time.Time) {
	if !r.LastCommit.IsZero() {
		telemetry.RecordHop(ctx, telemetry.HopCommitToStatus, r.Event.Topic, "", now.Sub(r.LastCommit))
	}
}

// DefaultExpireBatch is how many due events ExpireDue handles per call when
// given no limit.
const DefaultExpireBatch = 500

// ExpireReport says what ExpireDue did.
type ExpireReport struct {
	// Due is how many open events past their expireAt were found.
	Due int
	// Expired is how many of them are now EXPIRED.
	Expired int
	// More is true when the batch was full: call again.
	More bool
}

// ExpireDue rolls up open events whose expireAt has passed, so that events
// nobody reports on still become EXPIRED. Rollup notices do the same for
// events that are still being consumed; this sweep covers the silent ones.
// It reads the expiry index (shard, expireDue), which holds only open
// events with an expiry, up to limit of them (DefaultExpireBatch when <= 0).
// The rollup function serves it at POST /expire for Cloud Scheduler.
func (s *Store) ExpireDue(ctx context.Context, limit int) (ExpireReport, error) {
	if limit <= 0 {
		limit = DefaultExpireBatch
	}
	now := s.clock()
	q := fsdoc.ShapeExpireDue.Query(s.events.Query, nil)
	q = fsdoc.ShapeExpireDue.WithRange(q, nil, now.Add(time.Microsecond)).Select("eventId").Limit(limit)
	docs, err := s.queryDocs(ctx, nil, q)
	if err != nil {
		return ExpireReport{}, fmt.Errorf("ledger: expire: %w", err)
	}
	rep := ExpireReport{Due: len(docs), More: len(docs) == limit}
	var errs []error
	for _, d := range docs {
		id, _ := d.Data()["eventId"].(string)
		res, err := s.Rollup(ctx, id)
		if err != nil {
			if errors.Is(err, model.ErrEventNotFound) {
				continue
			}
			errs = append(errs, err)
			continue
		}
		if res.Status == model.StatusExpired {
			rep.Expired++
		}
		if res.Changed && res.Status.Settled() {
			recordSettled(ctx, res, s.clock())
		}
	}
	if err := errors.Join(errs...); err != nil {
		return rep, fmt.Errorf("ledger: expire: %w", err)
	}
	return rep, nil
}

// coalescer runs at most one rollup per event at a time in this process,
// and folds the calls that arrive meanwhile into one follow-up run.
type coalescer struct {
	mu   sync.Mutex
	keys map[string]*flightState
}

type flightState struct {
	next *flight // the follow-up run, once a caller waits for one
}

type flight struct {
	ctx  context.Context
	run  func(context.Context) (RollupResult, error)
	done chan struct{} // closed when res and err are set
	// waiters counts the callers that wait for it, its owner included.
	waiters int
	res     RollupResult
	err     error
}

// followUpTimeout bounds a follow-up run, which outlives the call that
// queued it when that call gives up.
const followUpTimeout = time.Minute

func (c *coalescer) do(ctx context.Context, key string, run func(context.Context) (RollupResult, error)) (RollupResult, error) {
	c.mu.Lock()
	if c.keys == nil {
		c.keys = map[string]*flightState{}
	}
	st, running := c.keys[key]
	if !running {
		c.keys[key] = &flightState{}
		c.mu.Unlock()
		res, err := run(ctx)
		c.finish(key)
		return res, err
	}
	f, owner := st.next, false
	if f == nil {
		f, owner = &flight{ctx: context.WithoutCancel(ctx), run: run, done: make(chan struct{})}, true
		st.next = f
	}
	f.waiters++
	c.mu.Unlock()
	select {
	case <-f.done:
		if owner {
			return f.res, f.err
		}
		res := f.res
		res.Changed, res.Coalesced = false, true
		return res, f.err
	case <-ctx.Done():
		return RollupResult{}, fmt.Errorf("ledger: rollup %s: %w", key, ctx.Err())
	}
}

// finish ends the current run of key and starts the queued follow-up, if
// any, which every caller queued so far shares.
func (c *coalescer) finish(key string) {
	c.mu.Lock()
	st := c.keys[key]
	f := st.next
	if f == nil {
		delete(c.keys, key)
		c.mu.Unlock()
		return
	}
	st.next = nil
	c.mu.Unlock()
	go func() {
		ctx, cancel := context.WithTimeout(f.ctx, followUpTimeout)
		f.res, f.err = f.run(ctx)
		cancel()
		close(f.done)
		c.finish(key)
	}()
}
