package ledger

import (
	"context"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/fscount"
	"github.com/relaybus/relaybus/internal/ledger/consumers"
	"github.com/relaybus/relaybus/internal/ledger/model"
	"github.com/relaybus/relaybus/internal/pubsubtest"
	"github.com/relaybus/relaybus/internal/registry"
	"github.com/relaybus/relaybus/shared/topology"
)

// Each topic's level decides what its events cost and keep, counted at
// the Firestore client's RPCs: full keeps every attempt as a document
// (N + 2 writes with N consumers), failures only the attempts of
// consumers that did not succeed at once (2 writes), off nothing at all
// (no write, no notice).
func TestLevelsDecideWhatIsKept(t *testing.T) {
	ctx := context.Background()
	top, err := topology.Parse([]byte(`
rollup: {topic: relaybus.ledger.rollup}
topics:
  - name: shop.full.events
    ledger: full
    consumers: [{service: billing}, {service: shipping}, {service: mailer}]
  - name: shop.lean.events
    consumers: [{service: billing}, {service: shipping}, {service: mailer}]
  - name: shop.quiet.events
    ledger: "off"
    consumers: [{service: billing}, {service: shipping}, {service: mailer}]
`))
	if err != nil {
		t.Fatal(err)
	}
	var counter fscount.Counter
	opened, err := Open(ctx, Config{ProjectID: emutest.FirestoreProject(t)}, Options{Levels: model.LevelsOf(top)}, counter.Options()...)
	if err != nil {
		t.Fatal(err)
	}
	s := withReaders(opened)
	t.Cleanup(func() { _ = s.Close() })
	if _, err := s.SyncConsumers(ctx, registry.Consumers(top), consumers.SyncOptions{}); err != nil {
		t.Fatal(err)
	}
	ps := pubsubtest.New(t)
	ps.Provision(t, top)
	rec := NewRecorder(ps.Client, RecorderOptions{Topic: top.Rollup.Topic, Levels: model.LevelsOf(top)})
	rollupSub := "relaybus.ledger.rollup.rollup-processor"

	for _, tc := range []struct {
		topic          string
		level          model.Level
		writes         int64
		attemptDocs    int
		status         model.Status
		noticeExpected bool
	}{
		{"shop.full.events", model.LevelFull, 3 + 2, 3, model.StatusConsumed, true},
		{"shop.lean.events", model.LevelFailures, 2, 0, model.StatusConsumed, true},
		{"shop.quiet.events", model.LevelOff, 0, 0, "", false},
	} {
		t.Run(string(tc.level), func(t *testing.T) {
			if got := s.level(tc.topic); got != tc.level {
				t.Fatalf("level of %s: %s, want %s", tc.topic, got, tc.level)
			}
			e := newEventOn(t, tc.topic, "thing.happened", time.Now())
			// Warm the registry cache for the topic, outside the count.
			if _, err := s.reg.ExpectedConsumers(ctx, tc.topic); err != nil {
				t.Fatal(err)
			}
			w0 := counter.Writes()
			if err := s.RecordSent(ctx, model.SentAt(time.Now(), e)); err != nil {
				t.Fatal(err)
			}
			var as []model.Attempt
			for _, c := range []string{"billing", "shipping", "mailer"} {
				a := attempt(e, c, 1, model.OutcomeSuccess)
				a.ConsumedAt = time.Now()
				as = append(as, a)
			}
			if err := rec.RecordAttempts(ctx, as); err != nil {
				t.Fatal(err)
			}
			if tc.noticeExpected {
				ns, err := model.ReadNotice(receiveOne(t, ps, rollupSub, nil))
				if err != nil || len(ns) != 1 || ns[0].EventID != e.ID || len(ns[0].Attempts) != 3 {
					t.Fatalf("notice %+v %v", ns, err)
				}
				if rs, err := s.Fold(ctx, ns, 0); err != nil || rs[0].Status != tc.status {
					t.Fatalf("fold: %+v %v", rs, err)
				}
			}
			if got := counter.Writes() - w0; got != tc.writes {
				t.Errorf("%d writes, want %d", got, tc.writes)
			}
			docs, err := s.readAttempts(ctx, nil, e.ID)
			if err != nil || len(docs) != tc.attemptDocs {
				t.Errorf("%d attempt documents (%v), want %d", len(docs), err, tc.attemptDocs)
			}
			d, err := s.Get(ctx, e.ID)
			if tc.level == model.LevelOff {
				if err == nil {
					t.Errorf("an event of an off topic is in the ledger: %+v", d.Event)
				}
				return
			}
			if err != nil || d.Summary() != "3/3 consumed" {
				t.Fatalf("detail %s %v", d.Summary(), err)
			}
		})
	}
	// Nothing was published for the off topic: no notice comes.
	quiet, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	stray := 0
	_ = ps.Client.PubSub().Subscriber(rollupSub).Receive(quiet, func(_ context.Context, m *pubsub.Message) {
		stray++
		m.Ack()
	})
	if stray != 0 {
		t.Errorf("%d rollup notices for an off topic, want none", stray)
	}
}

// A topology names a level the ledger knows, or is refused with the field
// and the rule.
func TestTopologyLedgerLevel(t *testing.T) {
	_, err := topology.Parse([]byte(`
rollup: {topic: relaybus.ledger.rollup}
topics:
  - name: shop.order.events
    ledger: everything
    consumers: [{service: billing}]
`))
	if err == nil || !strings.Contains(err.Error(), "ledger") || !strings.Contains(err.Error(), "full, failures or off") {
		t.Fatalf("ledger: everything: %v, want refused naming the field and the rule", err)
	}
	if l, err := model.ParseLevel(""); err != nil || l != model.DefaultLevel {
		t.Errorf("no level: %s %v, want %s", l, err, model.DefaultLevel)
	}
	if _, err := model.ParseLevel("most"); err == nil {
		t.Error("an unknown level accepted")
	}
}
