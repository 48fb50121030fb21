// Command publish serves the publish function (functions-framework-go) on
// $PORT (8080); the function is publish.Build over publish.Config read from the
// environment, as the local stack and the tests build it with theirs.
package main

import (
	_ "github.com/relaybus/relaybus/functions/publish"
	"github.com/relaybus/relaybus/internal/instance"
)

func main() { instance.Main("publish") }
