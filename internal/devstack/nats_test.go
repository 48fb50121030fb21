package devstack

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/emulator"
	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/internal/pgtest"
)

// make dev TRANSPORT=nats, in the test: the stack on a JetStream server
// embedded in it and no Pub/Sub at all, every function built by its own
// Build (the consumers in pull mode), driven through the demo scenario
// (a purchase end to end: publish, relay, two consumers, a retry, the
// children, the ledger final, a poison message dead-lettered, archived
// and replayed to one consumer) to its exact expected end state.
func TestDemoScenarioOnNATS(t *testing.T) {
	ctx := context.Background()
	_, schema := pgtest.SchemaConfig(t, nil)
	s, err := Start(ctx, Options{
		Addr: "127.0.0.1:0", StateDir: t.TempDir(), Project: emutest.FirestoreProject(t),
		DatabaseURL: pgtest.SchemaURL(t, schema), FirestoreHost: emutest.Host(t, emulator.Firestore),
		RelayEvery: 500 * time.Millisecond, Transport: instance.TransportNATS,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer closeStack(s)
	if s.PubSub != nil || s.Info.PubSubHost != "" || s.Info.Transport != instance.TransportNATS || s.Info.NATSURL == "" {
		t.Fatalf("a NATS stack with Pub/Sub: client %v, host %q; info transport %q, NATS %q", s.PubSub, s.Info.PubSubHost, s.Info.Transport, s.Info.NATSURL)
	}
	if started := strings.Join(s.Started, "\n"); !strings.Contains(started, "NATS        embedded JetStream server on nats://") {
		t.Errorf("the ready lines do not say where NATS runs:\n%s", started)
	}
	var out bytes.Buffer
	err = Demo(ctx, s.Info, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
}

func TestUnknownTransportIsAClearError(t *testing.T) {
	_, err := Start(context.Background(), Options{Addr: "127.0.0.1:0", StateDir: t.TempDir(), Transport: "kafka",
		DatabaseURL: "postgres://x", FirestoreHost: "127.0.0.1:1"})
	if err == nil || err.Error() != `TRANSPORT="kafka": want pubsub or nats` {
		t.Fatalf("Start with TRANSPORT=kafka: %v", err)
	}
}
