package archive_test

import (
	"context"
	"os"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/relaybus/relaybus/internal/archive"
	"github.com/relaybus/relaybus/internal/ledger/model"
)

// ByEvent answers one event's letters alone, of the consumer asked, newest
// first.
func TestByEvent(t *testing.T) {
	ctx := context.Background()
	s := archive.New(client(t))
	archiveAs := func(id, eventID, sub string) {
		if _, _, err := s.Archive(ctx, "shop.order.events.dlq", deadLettered(message(id, eventID), sub)); err != nil {
			t.Fatal(err)
		}
	}
	archiveAs("b1", "evt-b", "shop.order.events.member-service-processor")
	archiveAs("b2", "evt-b", "shop.order.events.message-service-processor")
	archiveAs("b3", "evt-b", "shop.order.events.member-service-processor")
	archiveAs("c1", "evt-c", "shop.order.events.member-service-processor")
	got, err := s.ByEvent(ctx, "evt-b", archive.Filter{Consumer: "member-service"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].ID != "b3" || got[1].ID != "b1" {
		t.Errorf("member-service's letters of evt-b: %+v, want b3 then b1", got)
	}
	if got, _ := s.ByEvent(ctx, "evt-none", archive.Filter{}); len(got) != 0 {
		t.Errorf("letters of an event with none: %+v", got)
	}
}

// ByEvent's query needs dead_letters/eventId's single-field index: the
// index file must not exempt it (the emulator would never tell).
func TestByEventKeepsItsIndex(t *testing.T) {
	b, err := os.ReadFile("../../infra/firestore/indexes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Exemptions []struct{ Collection, Field string } `yaml:"exemptions"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	for _, e := range f.Exemptions {
		if e.Collection == model.CollectionDeadLetters && e.Field == "eventId" {
			t.Error("dead_letters/eventId is exempt from indexing, but ByEvent queries it")
		}
	}
}
