// Command consume serves the consume function (functions-framework-go) on
// $PORT (8080) with the built-in handlers and the demo's (examples/shop);
// the function is consume.Build over consume.Config read from the
// environment, as the local stack and the tests build it with theirs.
package main

import (
	_ "github.com/relaybus/relaybus/examples/shop"
	_ "github.com/relaybus/relaybus/functions/consume"
	"github.com/relaybus/relaybus/shared/instance"
)

func main() { instance.Main("consume") }
