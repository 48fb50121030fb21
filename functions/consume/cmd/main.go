// Command consume serves the consume function (functions-framework-go) on
// $PORT (8080) with the built-in handlers and the demo's (examples/shop);
// the function is consume.Build over consume.Config read from the
// environment, as the local stack and the tests build it with theirs.
//
// `consume migrate` is the deploy's migrate step for one database
// (consume.MigrateDatabase over consume.MigrateConfig): the migrations,
// the consumers' handlers' tables, and a Postgres role of its own for
// every function and consumer that uses the database; then it exits.
package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	_ "github.com/relaybus/relaybus/examples/shop"
	"github.com/relaybus/relaybus/functions/consume"
	"github.com/relaybus/relaybus/internal/instance"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "migrate" {
		if err := migrate(context.Background()); err != nil {
			fmt.Fprintln(os.Stderr, "consume migrate:", err)
			os.Exit(1)
		}
		return
	}
	instance.Main("consume")
}

func migrate(ctx context.Context) error {
	cfg, err := instance.Load[consume.MigrateConfig](ctx)
	if err != nil {
		return err
	}
	rep, err := consume.MigrateDatabase(ctx, cfg)
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
