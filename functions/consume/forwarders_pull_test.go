package consume

import (
	"context"
	"strings"
	"testing"

	"github.com/relaybus/relaybus/internal/instance"
)

// The forwarders service's mode must match its transport: pull on NATS
// (JetStream pushes nothing), push on Pub/Sub (the operations API gives
// each forwarder a push subscription). A mismatch is refused at start,
// naming the variables, before anything is opened.
func TestTheForwardersServicesModeMatchesItsTransport(t *testing.T) {
	for _, tc := range []struct {
		name, transport, mode, want string
	}{
		{"pull on Pub/Sub", instance.TransportPubSub, ModePull, "CONSUMER_MODE=pull needs TRANSPORT=nats"},
		{"push on NATS", instance.TransportNATS, ModePush, "TRANSPORT=nats needs CONSUMER_MODE=pull"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Build(context.Background(), Config{ConsumerID: "forwarders", Handler: HandlerForwarders, Mode: tc.mode,
				PubSub: instance.PubSub{Transport: tc.transport, NATSURL: "nats://127.0.0.1:1"}})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Build: %v, want an error saying %q", err, tc.want)
			}
		})
	}
	for _, tc := range []struct{ transport, mode string }{{instance.TransportPubSub, ModePush}, {instance.TransportNATS, ModePull}} {
		if err := forwardersMode(Config{Mode: tc.mode, PubSub: instance.PubSub{Transport: tc.transport}}); err != nil {
			t.Errorf("TRANSPORT=%s CONSUMER_MODE=%s: %v, want accepted", tc.transport, tc.mode, err)
		}
	}
}
