// Command rollup serves the rollup function (functions-framework-go) on
// $PORT (8080), or, as `rollup sync-consumers`, makes the ledger's
// topic_consumers collection match the topology file ($RELAYBUS_TOPOLOGY)
// and exits: a deploy step to run before traffic, since the relay takes each
// event's expected consumers and publish its topic check from that
// collection. Both read rollup.Config.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/relaybus/relaybus/functions/rollup"
	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/internal/instance/fsopen"
	"github.com/relaybus/relaybus/internal/ledger"
	"github.com/relaybus/relaybus/internal/ledger/consumers"
	"github.com/relaybus/relaybus/internal/registry"
	"github.com/relaybus/relaybus/shared/topology"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "sync-consumers" {
		if err := syncConsumers(context.Background()); err != nil {
			fmt.Fprintln(os.Stderr, "rollup sync-consumers:", err)
			os.Exit(1)
		}
		return
	}
	instance.Main("rollup")
}

func syncConsumers(ctx context.Context) error {
	cfg, err := instance.Load[rollup.Config](ctx)
	if err != nil {
		return err
	}
	top, err := topology.Load(cfg.Topology)
	if err != nil {
		return err
	}
	store, err := fsopen.Ledger(ctx, cfg.Ledger, cfg.ProjectID, ledger.Options{})
	if err != nil {
		return err
	}
	defer store.Close()
	rep, err := consumers.New(store.Client(), consumers.Options{}).SyncConsumers(ctx, registry.Consumers(top), consumers.SyncOptions{DisableUnlisted: true})
	if err != nil {
		return err
	}
	fmt.Printf("topic_consumers: %d created, %d updated, %d disabled, %d unchanged, %d kept (operators' edits)\n", rep.Created, rep.Updated, rep.Disabled, rep.Unchanged, rep.Kept)
	return nil
}
