// Command consume serves the consume function (functions-framework-go) on
// $PORT (8080) with the built-in handlers and the demo's (examples/shop);
// configuration is the environment (see consume.Config).
package main

import (
	_ "github.com/relaybus/relaybus/examples/shop"
	_ "github.com/relaybus/relaybus/functions/consume"
	"github.com/relaybus/relaybus/shared/instance"
)

func main() { instance.Main("consume") }
