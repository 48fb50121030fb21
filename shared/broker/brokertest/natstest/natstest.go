// Package natstest runs an embedded NATS JetStream server for tests
// (github.com/nats-io/nats-server/v2/server), so the NATS transport runs
// here without a server installed.
package natstest

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Server starts a JetStream server in the test's process, storing in a
// temporary directory, on a free port, and returns its client URL; it
// shuts down when the test ends.
func Server(tb testing.TB) string {
	tb.Helper()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: tb.TempDir(), NoSigs: true})
	if err != nil {
		tb.Fatal(err)
	}
	s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		tb.Fatal("embedded NATS server not ready")
	}
	tb.Cleanup(s.Shutdown)
	return s.ClientURL()
}
