package consume_test

import (
	"net/http"
	"testing"

	"github.com/relaybus/relaybus/internal/ledger/model"

	"github.com/relaybus/relaybus/examples/shop"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/topology"
)

// A consumer may emit child events only to the topics its topology entry
// declares (emits): those are the topics Terraform lets its service account
// publish the after-commit kick to. The demo's member-service handler runs
// with the repository topology's declaration and emits its points.added;
// the same handler with nothing declared fails its attempt for good, the
// message naming the topic and the rule, so a handler whose topic is
// missing from the topology is caught on the local stack, not by a
// PermissionDenied in production.
func TestChildEventsGoOnlyToDeclaredTopics(t *testing.T) {
	top, err := topology.Load("")
	if err != nil {
		t.Fatal(err)
	}
	c, ok := top.Consumer("shop.order.events.member-service-processor")
	if !ok || len(c.Emits) == 0 {
		t.Fatalf("the repository topology declares no emits for member-service (%v)", c.Emits)
	}
	declared := newStackWith(t, pgtest.Schema(t), shop.Points(), "member-service", func(o *consumer.Options) { o.Emits = c.Emits })
	if a := declared.push(t, message(t, orderEvent("order-80", 1)), 1); a.code != http.StatusOK || a.res.Outcome != model.OutcomeSuccess {
		t.Fatalf("declared emit: %+v, want success", a)
	}
	undeclared := newStackWith(t, pgtest.Schema(t), shop.Points(), "member-service", func(o *consumer.Options) { o.Emits = []string{} })
	a := undeclared.push(t, message(t, orderEvent("order-81", 1)), 1)
	if a.code != http.StatusOK || a.res.Outcome != model.OutcomeFailed || a.res.Code != "emit_undeclared" {
		t.Fatalf("undeclared emit: %+v, want 200 failed emit_undeclared", a)
	}
}
