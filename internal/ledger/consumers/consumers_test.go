package consumers

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/relaybus/relaybus/internal/registry"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/topology"
)

func TestSyncConsumersFromTopology(t *testing.T) {
	ctx := context.Background()
	s, counter := newCountedStore(t, Options{})
	top, err := topology.Load("../../../infra/topology.yaml")
	if err != nil {
		t.Fatal(err)
	}
	entries := registry.Consumers(top)
	rep, err := s.SyncConsumers(ctx, entries, SyncOptions{DisableUnlisted: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Created != len(entries) || rep.Updated+rep.Disabled+rep.Unchanged != 0 {
		t.Errorf("first sync %+v", rep)
	}
	got, err := s.ExpectedConsumers(ctx, orderTopic)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := registry.FromTopology(top).ExpectedConsumers(ctx, orderTopic)
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("ledger registry %+v, topology %+v", got, want)
	}
	// Again: nothing to write.
	w0 := counter.Writes()
	rep, err = s.SyncConsumers(ctx, entries, SyncOptions{DisableUnlisted: true})
	if err != nil || rep.Unchanged != len(entries) || counter.Writes() != w0 {
		t.Errorf("second sync %+v %v, %d writes", rep, err, counter.Writes()-w0)
	}
	// A consumer leaves the topology: disabled, not deleted; one changes.
	var fewer []registry.Consumer
	for _, c := range entries {
		if c.ConsumerID == "message-service" {
			continue
		}
		if c.ConsumerID == "member-service" {
			c.Description = "points"
		}
		fewer = append(fewer, c)
	}
	rep, err = s.SyncConsumers(ctx, fewer, SyncOptions{DisableUnlisted: true})
	if err != nil || rep.Disabled != 1 || rep.Updated != 1 {
		t.Fatalf("shrinking sync %+v %v", rep, err)
	}
	got, _ = s.ExpectedConsumers(ctx, orderTopic)
	if len(got) != 1 || got[0].ConsumerID != "member-service" || got[0].Description != "points" {
		t.Errorf("after shrinking: %+v", got)
	}
	all, _ := s.topicConsumers(ctx, orderTopic)
	if len(all) != 2 {
		t.Errorf("disabled consumer deleted: %+v", all)
	}
	// Bad entries are refused whole, naming the field.
	_, err = s.SyncConsumers(ctx, []registry.Consumer{{Topic: "Bad Topic", ConsumerID: "x"}}, SyncOptions{})
	if !errors.Is(err, event.ErrInvalid) || strings.Join(fieldErrs(err), ",") != "consumers[0].topic" {
		t.Errorf("bad topic: %v", err)
	}
}
