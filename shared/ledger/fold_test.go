package ledger

import (
	"context"
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
	if err := s.RecordSent(ctx, SentAt(at, e)); err != nil {
		t.Fatal(err)
	}
	// A document as the former RecordSent wrote it: no folded mark.
	if _, err := s.eventRef(e.ID).Update(ctx, []firestore.Update{{Path: "folded", Value: firestore.Delete}}); err != nil {
		t.Fatal(err)
	}
	// The former write path: billing's attempt as a document, a rollup of
	// the id alone.
	old := attempt(e, "billing", 1, OutcomeSuccess)
	old.ConsumedAt, old.MessageID = at, "m-old"
	if err := s.InsertAttempts(ctx, []Attempt{old}); err != nil {
		t.Fatal(err)
	}
	if r, err := s.Rollup(ctx, e.ID); err != nil || r.Status != StatusSent || r.Reported != 1 {
		t.Fatalf("former rollup: %+v %v", r, err)
	}
	// The fold: shipping's attempt in its notice.
	folded := attempt(e, "shipping", 1, OutcomeSuccess)
	folded.ConsumedAt, folded.MessageID = at.Add(time.Millisecond), "m-new"
	ns, err := ReadNotice(FoldMessage([]Attempt{folded}))
	if err != nil {
		t.Fatal(err)
	}
	rs, err := s.Fold(ctx, ns, 0)
	if err != nil || rs[0].Err != nil || rs[0].Status != StatusConsumed || !rs[0].Changed {
		t.Fatalf("fold: %+v %v", rs, err)
	}
	d := mustGet(t, s, e.ID)
	if d.Summary() != "2/2 consumed" || len(d.Consumers) != 2 {
		t.Fatalf("detail %s %+v", d.Summary(), d.Consumers)
	}
	for _, c := range d.Consumers {
		want := map[string]string{"billing": "m-old", "shipping": "m-new"}[c.ConsumerID]
		if len(c.Attempts) != 1 || c.Attempts[0].MessageID != want || c.State != ConsumerSucceeded {
			t.Errorf("%s: %+v, want its one attempt (%s)", c.ConsumerID, c.Attempts, want)
		}
	}
	docs, err := s.readAttempts(ctx, OpQuery, nil, e.ID)
	if err != nil || len(docs) != 1 {
		t.Errorf("%d attempt documents (%v), want billing's alone", len(docs), err)
	}
	// A notice redelivered folds nothing new and writes nothing.
	if rs, err := s.Fold(ctx, ns, 0); err != nil || rs[0].Changed || len(rs[0].Event.Latest) != 2 {
		t.Errorf("again: %+v %v", rs, err)
	}
	// An attempt older than the mark does not move it back.
	stale := attempt(e, "shipping", 1, OutcomeRetry)
	stale.ConsumedAt = at
	if rs, err := s.Fold(ctx, []Notice{{EventID: e.ID, Attempts: []Attempt{stale}}}, 0); err != nil || rs[0].Status != StatusConsumed {
		t.Errorf("a stale attempt: %+v %v", rs, err)
	}
	page, err := s.List(ctx, ListQuery{Topic: orderTopic})
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
}
