// Command publish serves the publish function (functions-framework-go) on
// $PORT (8080); configuration is the environment (see publish.Config).
package main

import (
	_ "github.com/relaybus/relaybus/functions/publish"
	"github.com/relaybus/relaybus/shared/instance"
)

func main() { instance.Main("publish") }
