package consume_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/relaybus/relaybus/internal/claimcheck"
	"github.com/relaybus/relaybus/internal/deadletter"
	"github.com/relaybus/relaybus/internal/ledger/model"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/projection"
)

// A message whose claim-checked object is missing, or that names one while
// the consumer has no store, is acknowledged, dead-lettered with reason
// claim_check and an error that names the reference (the dead letter
// keeps the reference, so a replay after the object is restored works);
// a store that fails asks for redelivery. Nothing reaches the handler.
func TestClaimCheckFailuresAreDeadLetteredOrRedelivered(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	store, err := claimcheck.NewDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	checker, err := claimcheck.New(claimcheck.Options{Store: store, Threshold: 64})
	if err != nil {
		t.Fatal(err)
	}
	claimed := func(agg string) event.Message {
		m, err := checker.Offload(ctx, topic, message(t, orderEvent(agg, 1)))
		if err != nil {
			t.Fatal(err)
		}
		if m.Attributes[event.AttrClaimCheck] == "" {
			t.Fatal("the test message was not claim-checked")
		}
		return m
	}
	mux := consumer.NewMux()
	mux.Register("order.purchased", "v1", projection.Latest())
	s := newStackWith(t, pgtest.Schema(t), mux, "member-service", func(o *consumer.Options) { o.Claims = checker })

	// The object is there: applied.
	if a := s.push(t, claimed("order-ok"), 1); a.code != 200 || a.res.Outcome != model.OutcomeSuccess {
		t.Fatalf("object present: %+v, want 200 success", a)
	}

	// The object is gone.
	missing := claimed("order-gone")
	if err := checker.Delete(ctx, topic, missing.Attributes[event.AttrEventID]); err != nil {
		t.Fatal(err)
	}
	ref := missing.Attributes[event.AttrClaimCheck]
	a := s.push(t, missing, 1)
	if a.code != 200 || a.res.Outcome != model.OutcomePoison || a.res.Code != event.ReasonClaimCheck || !strings.Contains(a.res.Error, ref) {
		t.Fatalf("object missing: %+v, want 200 poison %s naming %s", a, event.ReasonClaimCheck, ref)
	}
	msgs := s.fake.Server.Messages()
	if len(msgs) != 1 {
		t.Fatalf("%d dead letters, want 1", len(msgs))
	}
	info := deadletter.Read(event.Message{Attributes: msgs[0].Attributes})
	if info.Reason != event.ReasonClaimCheck || !strings.Contains(info.Error, ref) || msgs[0].Attributes[event.AttrClaimCheck] != ref {
		t.Errorf("dead letter: %+v, attributes %v; want reason %s naming %s, the reference kept", info, msgs[0].Attributes, event.ReasonClaimCheck, ref)
	}

	// The store fails (the object's path is a directory): redelivery.
	broken := claimed("order-broken")
	p := filepath.Join(dir, topic, broken.Attributes[event.AttrEventID])
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(p, 0o750); err != nil {
		t.Fatal(err)
	}
	if a := s.push(t, broken, 1); a.code != 503 || a.res.Code != event.ReasonClaimCheck {
		t.Errorf("store failing: %+v, want 503 %s", a, event.ReasonClaimCheck)
	}
	if n := len(s.fake.Server.Messages()); n != 1 {
		t.Errorf("%d dead letters after a store failure, want still 1", n)
	}

	// A consumer without a store.
	bare := newStackWith(t, pgtest.Schema(t), mux, "member-service", nil)
	if a := bare.push(t, claimed("order-nostore"), 1); a.code != 200 || a.res.Code != event.ReasonClaimCheck || !strings.Contains(a.res.Error, "CLAIM_CHECK_BUCKET") {
		t.Errorf("no store: %+v, want 200 poison %s naming CLAIM_CHECK_BUCKET", a, event.ReasonClaimCheck)
	}
	if n := s.count(t, `SELECT count(*) FROM relaybus_inbox`); n != 1 {
		t.Errorf("%d inbox rows, want only the one whose object was there", n)
	}
}
