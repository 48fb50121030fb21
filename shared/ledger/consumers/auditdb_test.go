package consumers

import (
	"context"
	"testing"

	"cloud.google.com/go/firestore"

	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/shared/ledger/audit"
)

// TestChangeConsumerAuditsInADatabaseOfItsOwn: with the audit log in a
// Firestore database of its own (production's, where no service may
// change or delete an entry), an edit's entry lands there and not in the
// registry's database; an edit whose entry cannot be written is not made.
func TestChangeConsumerAuditsInADatabaseOfItsOwn(t *testing.T) {
	ctx := context.Background()
	project := emutest.FirestoreProject(t)
	ledgerDB, err := firestore.NewClientWithDatabase(ctx, project, "(default)")
	if err != nil {
		t.Fatal(err)
	}
	defer ledgerDB.Close()
	auditDB, err := firestore.NewClientWithDatabase(ctx, project, "relaybus-audit")
	if err != nil {
		t.Fatal(err)
	}
	defer auditDB.Close()
	log := audit.New(auditDB, nil)
	s := testStore{New(ledgerDB, Options{Audit: log})}
	seed(t, s, orderTopic, "member-service", "message-service")

	off := false
	_, logged, err := s.ChangeConsumer(ctx, ConsumerChange{Topic: orderTopic, ConsumerID: "message-service", Enabled: &off}, "ops@example.com")
	if err != nil || logged == nil || logged.Action != audit.ConsumerDisable {
		t.Fatalf("disable: %+v %v", logged, err)
	}
	entries, err := log.List(ctx, audit.Query{})
	if err != nil || len(entries) != 1 || entries[0].ID != logged.ID || entries[0].By != "ops@example.com" || entries[0].Detail != "enabled: true → false" {
		t.Fatalf("the audit database holds %+v (%v), want the one disable", entries, err)
	}
	if inLedger, err := audit.New(ledgerDB, nil).List(ctx, audit.Query{}); err != nil || len(inLedger) != 0 {
		t.Errorf("the ledger's database holds audit entries %+v (%v)", inLedger, err)
	}

	// The audit database unreachable: the edit is refused and not made.
	broken, err := firestore.NewClientWithDatabase(ctx, project, "relaybus-audit")
	if err != nil {
		t.Fatal(err)
	}
	_ = broken.Close()
	s2 := testStore{New(ledgerDB, Options{Audit: audit.New(broken, nil)})}
	if _, _, err := s2.ChangeConsumer(ctx, ConsumerChange{Topic: orderTopic, ConsumerID: "member-service", Enabled: &off}, "ops@example.com"); err == nil {
		t.Fatal("an edit whose audit entry could not be written was made")
	}
	exp, err := s.ExpectedConsumers(ctx, orderTopic)
	if err != nil || len(exp) != 1 || exp[0].ConsumerID != "member-service" {
		t.Errorf("member-service after the refused edit: %+v %v, want it still enabled", exp, err)
	}
}
