// Command relay serves the relay function (functions-framework-go) on
// $PORT (8080); the function is relay.Build over relay.Config read from the
// environment, as the local stack and the tests build it with theirs.
package main

import (
	_ "github.com/relaybus/relaybus/functions/relay"
	"github.com/relaybus/relaybus/internal/instance"
)

func main() { instance.Main("relay") }
