package consume

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/relaybus/relaybus/internal/instance"
)

// Main is the consume command, for a binary's main function: it serves
// the consume function on $PORT (instance.Main: graceful shutdown on
// SIGTERM) with the handlers registered in the binary, or, as `<binary>
// migrate`, runs the deploy's migrate step for one database
// (MigrateDatabase over MigrateConfig) and exits.
//
// The consume binary relaybus ships (functions/consume/cmd) registers only
// the built-in handlers (projection, strict, forward). A team's consumer
// is a binary of its own that registers its handlers (RegisterHandler, in
// an init function) and calls Main, as examples/loyalty and the demo's
// examples/shop/cmd do.
func Main() {
	if len(os.Args) > 1 && os.Args[1] == "migrate" {
		if err := migrateCommand(context.Background()); err != nil {
			fmt.Fprintln(os.Stderr, "consume migrate:", err)
			os.Exit(1)
		}
		return
	}
	instance.Main("consume")
}

// migrateCommand is `consume migrate`: MigrateDatabase over the
// MigrateConfig read from the environment, and a line saying what it did.
func migrateCommand(ctx context.Context) error {
	cfg, err := instance.Load[MigrateConfig](ctx)
	if err != nil {
		return err
	}
	rep, err := MigrateDatabase(ctx, cfg)
	if err != nil {
		return err
	}
	fmt.Printf("database %s: migrated (handlers' tables: %s); roles: %s\n", rep.Database, orNone(rep.Handlers), orNone(rep.Roles))
	return nil
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}
