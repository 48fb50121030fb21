package dlqreplay_test

import (
	"context"
	"testing"

	"github.com/relaybus/relaybus/internal/ledger/consumers"

	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/internal/registry"
)

// Registry ownership: an operator's edit through the API survives every
// later deploy's sync (the same SyncConsumers rollup sync-consumers runs,
// with DisableUnlisted as Terraform's job does), and the listing says who
// owns each entry and states the rule.
func TestRegistryEditsSurviveASync(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, dlqreplay.AuthNone, "")
	sync := func() consumers.SyncReport {
		t.Helper()
		rep, err := consumers.New(e.store.Client(), consumers.Options{}).SyncConsumers(ctx, registry.Consumers(e.top), consumers.SyncOptions{DisableUnlisted: true})
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	sync()
	var out map[string]any
	if code := e.call(t, "POST", "/consumers/shop.order.events/message-service:disable", nil, &out); code != 200 {
		t.Fatalf("disable: %d %v", code, out)
	}
	if code := e.call(t, "POST", "/consumers", map[string]any{"topic": "shop.order.events", "consumerId": "fraud-check"}, &out); code != 200 {
		t.Fatalf("add: %d %v", code, out)
	}
	if code := e.call(t, "PATCH", "/consumers/member.points.events/audit-service", map[string]any{"description": "the auditors' copy"}, &out); code != 200 {
		t.Fatalf("describe: %d %v", code, out)
	}
	rep := sync()
	if rep.Kept != 3 || rep.Updated != 0 || rep.Disabled != 0 {
		t.Errorf("sync after the edits %+v, want the 3 edited entries kept and nothing rewritten", rep)
	}
	var list struct {
		Consumers []struct {
			Topic, ConsumerID, Description, Owner string
			Enabled                               bool
		}
		Ownership string
	}
	if code := e.call(t, "GET", "/consumers", nil, &list); code != 200 {
		t.Fatal(code)
	}
	seen := 0
	for _, c := range list.Consumers {
		switch c.Topic + "/" + c.ConsumerID {
		case "shop.order.events/message-service":
			seen++
			if c.Enabled || c.Owner != "operator" {
				t.Errorf("message-service after a sync: enabled %v, owner %s; want disabled, operator", c.Enabled, c.Owner)
			}
		case "shop.order.events/fraud-check":
			seen++
			if !c.Enabled || c.Owner != "operator" {
				t.Errorf("fraud-check after a sync: enabled %v, owner %s; want enabled (the sync disables only its own unlisted entries)", c.Enabled, c.Owner)
			}
		case "member.points.events/audit-service":
			seen++
			if c.Description != "the auditors' copy" || c.Owner != "operator" {
				t.Errorf("audit-service after a sync: %q, owner %s", c.Description, c.Owner)
			}
		case "shop.order.events/member-service":
			seen++
			if c.Owner != "topology" {
				t.Errorf("member-service owner %s, want topology", c.Owner)
			}
		}
	}
	if seen != 4 || list.Ownership == "" {
		t.Errorf("listing %+v", list)
	}
}
