// Command dlqreplay serves the operations API (functions-framework-go) on
// $PORT (8080); the function is dlqreplay.Build over dlqreplay.Config read from
// the environment, as the local stack and the tests build it with theirs.
package main

import (
	_ "github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/internal/instance"
)

func main() { instance.Main("dlqreplay") }
