package ledger

import (
	"context"
	"github.com/relaybus/relaybus/internal/ledger/model"
	"github.com/relaybus/relaybus/internal/ledger/query"
	"testing"
	"time"

	"cloud.google.com/go/firestore"
)

// A ledger written before the fold (every attempt a document, marks
// without delivery facts, notices naming only event ids) is read as it is,
// not migrated: a notice that carries an attempt folds next to the
// documents, and every reader (Get, ConsumedCounts, RecentHops) shows each
// attempt once, whether it is a document or a folded mark.
func TestALedgerWrittenBeforeTheFoldIsReadAsItIs(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, Options{})
	seed(t, s, orderTopic, "billing", "shipping")
	at := time.Now().UTC()
	e := newEventOn(t, orderTopic, "order.purchased", at)
	if err := s.RecordSent(ctx, model.SentAt(at, e)); err != nil {
		t.Fatal(err)
	}
	// A document as the former RecordSent wrote it: no folded mark.
	if _, err := s.eventRef(e.ID).Update(ctx, []firestore.Update{{Path: "folded", Value: firestore.Delete}}); err != nil {
		t.Fatal(err)
	}
	// The former write path: billing's attempt as a document, a rollup of
	// the id alone.
	old := attempt(e, "billing", 1, model.OutcomeSuccess)
	old.ConsumedAt, old.MessageID = at, "m-old"
	if err := s.InsertAttempts(ctx, []model.Attempt{old}); err != nil {
		t.Fatal(err)
	}
	if r, err := s.Rollup(ctx, e.ID); err != nil || r.Status != model.StatusSent || r.Reported != 1 {
		t.Fatalf("former rollup: %+v %v", r, err)
	}
	// The fold: shipping's attempt in its notice.
	folded := attempt(e, "shipping", 1, model.OutcomeSuccess)
	folded.ConsumedAt, folded.MessageID = at.Add(time.Millisecond), "m-new"
	ns, err := model.ReadNotice(model.FoldMessage([]model.Attempt{folded}))
	if err != nil {
		t.Fatal(err)
	}
	rs, err := s.Fold(ctx, ns, 0)
	if err != nil || rs[0].Err != nil || rs[0].Status != model.StatusConsumed || !rs[0].Changed {
		t.Fatalf("fold: %+v %v", rs, err)
	}
	d := mustGet(t, s, e.ID)
	if d.Summary() != "2/2 consumed" || len(d.Consumers) != 2 {
		t.Fatalf("detail %s %+v", d.Summary(), d.Consumers)
	}
	for _, c := range d.Consumers {
		want := map[string]string{"billing": "m-old", "shipping": "m-new"}[c.ConsumerID]
		if len(c.Attempts) != 1 || c.Attempts[0].MessageID != want || c.State != model.ConsumerSucceeded {
			t.Errorf("%s: %+v, want its one attempt (%s)", c.ConsumerID, c.Attempts, want)
		}
	}
	docs, err := s.readAttempts(ctx, nil, e.ID)
	if err != nil || len(docs) != 1 {
		t.Errorf("%d attempt documents (%v), want billing's alone", len(docs), err)
	}
	// A notice redelivered folds nothing new and writes nothing.
	if rs, err := s.Fold(ctx, ns, 0); err != nil || rs[0].Changed || len(rs[0].Event.Latest) != 2 {
		t.Errorf("again: %+v %v", rs, err)
	}
	page, err := s.List(ctx, query.ListQuery{Topic: orderTopic})
	if err != nil || len(page.Events) == 0 {
		t.Fatalf("list: %v", err)
	}
	counts, err := s.ConsumedCounts(ctx, page.Events)
	if err != nil || counts[e.ID] != 2 {
		t.Errorf("consumed counts %v %v, want 2", counts, err)
	}
	hops, err := s.RecentHops(ctx, at.Add(-time.Minute), 10, 10)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hops {
		if h.EventID == e.ID && len(h.Consumers) != 2 {
			t.Errorf("hops %+v, want both consumers' first commits", h.Consumers)
		}
	}
	// An attempt older than the mark does not move it back (last: the
	// fold keeps this made-up retry, numbered as the success it precedes,
	// as a document, which the readers above would show too).
	stale := attempt(e, "shipping", 1, model.OutcomeRetry)
	stale.ConsumedAt = at
	if rs, err := s.Fold(ctx, []model.Notice{{EventID: e.ID, Attempts: []model.Attempt{stale}}}, 0); err != nil || rs[0].Status != model.StatusConsumed {
		t.Errorf("a stale attempt: %+v %v", rs, err)
	}
}

// The relay records sends in the background and, after a burst or a
// crash, late: a notice that reaches the rollup before its event's send
// creates the event's document (one read, one write) instead of waiting
// for it, so the status is final as soon as the consumers have reported.
// The send, when it comes, adds the envelope and its fields to that
// document (one read, one write besides its create, which finds the
// document there) and leaves the status the consumers gave it; a replayed
// send changes nothing.
func TestAFoldBeforeTheSendCreatesTheEvent(t *testing.T) {
	ctx := context.Background()
	s, counter := newCountedStore(t, Options{})
	seed(t, s, orderTopic, "billing", "shipping")
	if _, err := s.Expected(ctx, orderTopic); err != nil { // the registry's cache, as a running rollup has it
		t.Fatal(err)
	}
	at := time.Now().UTC().Truncate(time.Millisecond)
	e := newEventOn(t, orderTopic, "order.purchased", at)
	ok := newEventOn(t, orderTopic, "order.purchased", at)
	as := []model.Attempt{attempt(e, "billing", 1, model.OutcomeSuccess), attempt(e, "shipping", 1, model.OutcomeSuccess),
		attempt(ok, "billing", 1, model.OutcomeSuccess), attempt(ok, "shipping", 1, model.OutcomeRetry)}
	for i := range as {
		as[i].ConsumedAt = at.Add(time.Duration(i) * time.Millisecond)
	}
	ns, err := model.ReadNotice(model.FoldMessage(as))
	if err != nil {
		t.Fatal(err)
	}
	r0, w0 := counter.Reads(), counter.Writes()
	rs, err := s.Fold(ctx, ns, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if r := rs[0]; r.Err != nil || !r.Changed || r.Status != model.StatusConsumed || r.Expected != 2 || r.Succeeded != 2 {
		t.Fatalf("fold of %s before its send: %+v, want CONSUMED, 2/2", e.ID, r)
	}
	if r := rs[1]; r.Err != nil || !r.Changed || r.Status != model.StatusPartial {
		t.Fatalf("fold of %s before its send: %+v, want PARTIAL", ok.ID, r)
	}
	if r, w := counter.Reads()-r0, counter.Writes()-w0; r != 2 || w != 3 {
		t.Errorf("the fold of two events not in the ledger: %d reads, %d writes; want one of each per event and the retry's document", r, w)
	}
	d := mustGet(t, s, e.ID)
	if d.Summary() != "2/2 consumed" || d.Event.EventType != "" || !d.Event.SentAt.IsZero() {
		t.Fatalf("before the send: %s type %q sentAt %v", d.Summary(), d.Event.EventType, d.Event.SentAt)
	}

	sentAt := at.Add(-time.Second)
	r0, w0 = counter.Reads(), counter.Writes()
	if err := s.RecordSent(ctx, model.SentAt(sentAt, e, ok)); err != nil {
		t.Fatal(err)
	}
	if r, w := counter.Reads()-r0, counter.Writes()-w0; r != 2 || w != 4 {
		t.Errorf("the sends of two events the rollup created: %d reads, %d writes; want per event one read, the create that found the document and one write", r, w)
	}
	d = mustGet(t, s, e.ID)
	got := d.Event
	if got.Status != model.StatusConsumed || got.EventType != e.Type || got.AggregateID != e.AggregateID || got.Initiator.UserID != e.Initiator.UserID ||
		string(got.Payload) != string(e.Payload) || !got.SentAt.Equal(sentAt) || !got.LastSentAt.Equal(sentAt) || d.Summary() != "2/2 consumed" {
		t.Fatalf("after the send: %+v %s", got, d.Summary())
	}
	if !got.CheckAt.IsZero() {
		t.Errorf("a CONSUMED event is due for the reconciler at %v", got.CheckAt)
	}
	if d := mustGet(t, s, ok.ID); d.Event.Status != model.StatusPartial || d.Event.CheckAt.IsZero() || d.Event.EventType != ok.Type {
		t.Errorf("%s after the send: %s checkAt %v type %q, want PARTIAL, due for the reconciler", ok.ID, d.Event.Status, d.Event.CheckAt, d.Event.EventType)
	}

	// A replayed send leaves the document exactly as it is.
	if err := s.RecordSent(ctx, model.SentAt(sentAt.Add(time.Minute), e)); err != nil {
		t.Fatal(err)
	}
	if again := mustGet(t, s, e.ID).Event; !again.SentAt.Equal(got.SentAt) || !again.UpdatedAt.Equal(got.UpdatedAt) || again.Status != got.Status {
		t.Errorf("a replayed send changed the document: %+v", again)
	}
}
