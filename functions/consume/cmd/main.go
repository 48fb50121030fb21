// Command consume serves the consume function (functions-framework-go) on
// $PORT (8080) with the built-in handlers only (projection, strict,
// forward: CONSUMER_HANDLER); the function is consume.Build over
// consume.Config read from the environment, as the local stack and the
// tests build it with theirs. A consumer with handlers of its own is a
// binary of its own that registers them and calls consume.Main
// (examples/loyalty; the demo's is examples/shop/cmd).
//
// `consume migrate` is the deploy's migrate step for one database
// (consume.MigrateDatabase over consume.MigrateConfig): the migrations,
// the consumers' handlers' tables, and a Postgres role of its own for
// every function and consumer that uses the database; then it exits.
package main

import "github.com/relaybus/relaybus/functions/consume"

func main() { consume.Main() }
