package consumers

import (
	"context"
	"testing"

	"cloud.google.com/go/firestore"

	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/ledger/audit"
)

// TestChangeConsumerAuditsInADatabaseOfItsOwn: with the audit log in a
// Firestore database of its own (production's, where no service may
// change or delete an entry), an edit writes no entry in the registry's
// database and none before it commits: it returns its outcome entry
// unwritten (no ID), for the caller to append to the audit database once
// the change has committed (the operations API wrote its started entry
// before the change, and refuses the change when it cannot). With the log
// in the registry's database the entry is written in the change's
// transaction.
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
	ch := ConsumerChange{Topic: orderTopic, ConsumerID: "message-service", Enabled: &off,
		Audit: audit.Entry{Method: "cloudrun", RequestID: "r-1", Ref: "started-1"}}
	_, logged, err := s.ChangeConsumer(ctx, ch, "ops@example.com")
	if err != nil || logged == nil || logged.Action != audit.ConsumerDisable {
		t.Fatalf("disable: %+v %v", logged, err)
	}
	if logged.ID != "" || logged.Outcome != audit.OutcomeSucceeded || logged.By != "ops@example.com" || logged.Detail != "enabled: true → false" ||
		logged.Ref != "started-1" || logged.RequestID != "r-1" {
		t.Fatalf("the outcome entry %+v, want an unwritten succeeded entry referencing the started one", logged)
	}
	if entries, err := log.List(ctx, audit.Query{}); err != nil || len(entries) != 0 {
		t.Errorf("the audit database holds %+v (%v) before the caller appended the outcome", entries, err)
	}
	if inLedger, err := audit.New(ledgerDB, nil).List(ctx, audit.Query{}); err != nil || len(inLedger) != 0 {
		t.Errorf("the ledger's database holds audit entries %+v (%v)", inLedger, err)
	}
	if exp, err := s.ExpectedConsumers(ctx, orderTopic); err != nil || len(exp) != 1 || exp[0].ConsumerID != "member-service" {
		t.Errorf("after the disable: %+v %v, want member-service alone", exp, err)
	}

	// The log in the registry's database: the entry is written with the
	// change, in its transaction.
	shared := audit.New(ledgerDB, nil)
	s2 := testStore{New(ledgerDB, Options{Audit: shared})}
	on := true
	_, logged, err = s2.ChangeConsumer(ctx, ConsumerChange{Topic: orderTopic, ConsumerID: "message-service", Enabled: &on}, "ops@example.com")
	if err != nil || logged == nil || logged.ID == "" {
		t.Fatalf("enable with a shared log: %+v %v, want a written entry", logged, err)
	}
	if entries, err := shared.List(ctx, audit.Query{}); err != nil || len(entries) != 1 || entries[0].ID != logged.ID {
		t.Errorf("the shared log holds %+v (%v), want the enable", entries, err)
	}
}
