// Package pubsubtest starts an in-process pstest server for a test and hands
// back a relaybus transport client connected to it.
package pubsubtest

import (
	"context"
	"testing"

	"cloud.google.com/go/pubsub/v2/pstest"

	"github.com/relaybus/relaybus/shared/broker/pubsub"
	"github.com/relaybus/relaybus/shared/topology"
)

// Project is the project id the fake serves.
const Project = "relaybus-test"

// Fake is a pstest server and a client of it.
type Fake struct {
	Server *pstest.Server
	Client *pubsub.Client
}

// New starts a pstest server (with optional reactors, e.g. for error
// injection) and connects a transport client; both close when the test ends.
func New(t testing.TB, reactors ...pstest.ServerReactorOption) *Fake {
	t.Helper()
	srv := pstest.NewServer(reactors...)
	c, err := pubsub.Dial(context.Background(), Project, srv.Addr, pubsub.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Close()
		_ = srv.Close()
	})
	return &Fake{Server: srv, Client: c}
}

// Provision creates a topology's topics and subscriptions in the fake
// (without dead-letter policies: pstest's dead-lettering is broken).
func (f *Fake) Provision(t testing.TB, top *topology.Topology) {
	t.Helper()
	if err := f.Client.Provision(context.Background(), top); err != nil {
		t.Fatal(err)
	}
}
