// Command dlqreplay serves the operations API (functions-framework-go) on
// $PORT (8080); configuration is the environment (see dlqreplay.Config).
package main

import (
	_ "github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/shared/instance"
)

func main() { instance.Main("dlqreplay") }
