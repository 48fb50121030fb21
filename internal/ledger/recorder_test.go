package ledger

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/ledger/model"
	"github.com/relaybus/relaybus/internal/pubsubtest"
	"github.com/relaybus/relaybus/shared/topology"
)

// TestConsumeRecordsThroughTheRollupOnly: consume's Recorder has no
// Firestore client (a consumer's identity holds no grant on the ledger):
// its notices carry every attempt, a failure's error message included
// (cut to MaxErrorText), and the rollup's Fold writes the documents the
// level keeps, so a failed attempt is in the ledger with its message and
// a first success is a folded mark only.
func TestConsumeRecordsThroughTheRollupOnly(t *testing.T) {
	ctx := context.Background()
	top, err := topology.Parse([]byte(`
rollup: {topic: relaybus.ledger.rollup}
topics:
  - name: shop.order.events
    consumers: [{service: billing}, {service: shipping}]
`))
	if err != nil {
		t.Fatal(err)
	}
	s := newStore(t, Options{Levels: model.LevelsOf(top)})
	seed(t, s, orderTopic, "billing", "shipping")
	ps := pubsubtest.New(t)
	ps.Provision(t, top)
	rec := NewRecorder(ps.Client, RecorderOptions{Topic: top.Rollup.Topic, Levels: model.LevelsOf(top)})

	e := newEventOn(t, orderTopic, "order.purchased", time.Now())
	if err := s.RecordSent(ctx, model.SentAt(time.Now(), e)); err != nil {
		t.Fatal(err)
	}
	ok := attempt(e, "billing", 1, model.OutcomeSuccess)
	failed := attempt(e, "shipping", 1, model.OutcomeFailed)
	failed.ErrorCode, failed.ErrorMessage = "forward_500", strings.Repeat("x", model.MaxErrorText+100)
	if err := rec.RecordAttempts(ctx, []model.Attempt{ok, failed}); err != nil {
		t.Fatal(err)
	}
	ns, err := model.ReadNotice(receiveOne(t, ps, "relaybus.ledger.rollup.rollup-processor", nil))
	if err != nil || len(ns) != 1 || len(ns[0].Attempts) != 2 {
		t.Fatalf("notice %+v %v", ns, err)
	}
	if docs, _ := s.readAttempts(ctx, nil, e.ID); len(docs) != 0 {
		t.Fatalf("%d attempt documents before the rollup: the recorder wrote Firestore", len(docs))
	}
	if rs, err := s.Fold(ctx, ns, 0); err != nil || rs[0].Status != model.StatusPartial {
		t.Fatalf("fold: %+v %v", rs, err)
	}
	docs, err := s.readAttempts(ctx, nil, e.ID)
	if err != nil || len(docs) != 1 || docs[0].ConsumerID != "shipping" || docs[0].ErrorCode != "forward_500" || len(docs[0].ErrorMessage) != model.MaxErrorText {
		t.Fatalf("attempt documents after the fold: %+v %v, want shipping's failure with its message cut to %d", docs, err, model.MaxErrorText)
	}
}
