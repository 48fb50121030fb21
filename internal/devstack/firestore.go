package devstack

import (
	"context"
	"fmt"
	"github.com/relaybus/relaybus/internal/privacy/topologyrules"
	"log/slog"
	"time"

	"github.com/relaybus/relaybus/internal/emulator"
	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/internal/instance/fsopen"
	"github.com/relaybus/relaybus/internal/ledger"
	ledgerconsumers "github.com/relaybus/relaybus/internal/ledger/consumers"
	"github.com/relaybus/relaybus/internal/ledger/model"
	"github.com/relaybus/relaybus/internal/registry"
	"github.com/relaybus/relaybus/shared/topology"
)

// firestoreServer is the Firestore the ledger lives in:
// FIRESTORE_EMULATOR_HOST's, or an emulator the stack started.
type firestoreServer struct {
	// Host is the emulator's host:port.
	Host string
	// Started says what was started ("" when the host was given).
	Started string
}

// startFirestore starts the gcloud Firestore emulator unless host names a
// running one.
func startFirestore(ctx context.Context, host string, down *teardown) (firestoreServer, error) {
	if host != "" {
		return firestoreServer{Host: host}, nil
	}
	p, err := emulator.Start(ctx, emulator.Firestore, emulator.Options{})
	if err != nil {
		return firestoreServer{}, fmt.Errorf("firestore emulator: %w", err)
	}
	down.push(func(context.Context) { p.Stop() })
	return firestoreServer{Host: p.Host, Started: "Firestore   emulator on " + p.Host}, nil
}

// openLedger opens the stack's own ledger client on cfg and seeds the
// topic_consumers registry from the topology: it must be seeded before
// the first event is recorded (its expected consumers come from it), and a
// Firestore that does not answer is a clear error, not a start that hangs.
func openLedger(ctx context.Context, cfg instance.Ledger, project string, top *topology.Topology, log *slog.Logger, down *teardown) (*ledger.Store, error) {
	store, err := fsopen.Ledger(ctx, cfg, project, ledger.Options{Logger: log, Levels: model.LevelsOf(top), Privacy: topologyrules.Of(top)})
	if err != nil {
		return nil, err
	}
	down.push(func(context.Context) { _ = store.Close() })
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := ledgerconsumers.New(store.Client(), ledgerconsumers.Options{}).SyncConsumers(sctx, registry.Consumers(top), ledgerconsumers.SyncOptions{DisableUnlisted: true}); err != nil {
		return nil, fmt.Errorf("topic_consumers: Firestore at %s did not answer in 30 s: %w", cfg.EmulatorHost, err)
	}
	return store, nil
}
