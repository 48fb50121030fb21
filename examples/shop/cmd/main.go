// Command cmd is the demo's consume binary: the consume function with the
// built-in handlers and the demo's (examples/shop: example.points,
// example.notify), for a deployment of the demo topology
// (infra/topology.yaml names those handlers). Build its image with
//
//	docker build -f infra/docker/Dockerfile --build-arg FUNCTION=consume --build-arg CMD=./examples/shop/cmd .
//
// The consume binary relaybus ships (functions/consume/cmd) links none of
// the demo; the local stack registers the demo's handlers itself.
package main

import (
	_ "github.com/relaybus/relaybus/examples/shop" // registers example.points and example.notify
	"github.com/relaybus/relaybus/functions/consume"
)

func main() { consume.Main() }
