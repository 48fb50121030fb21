// Command relay serves the relay function (functions-framework-go) on
// $PORT (8080); configuration is the environment (see relay.Config).
package main

import (
	_ "github.com/relaybus/relaybus/functions/relay"
	"github.com/relaybus/relaybus/shared/instance"
)

func main() { instance.Main("relay") }
