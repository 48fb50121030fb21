package brokeropen

import (
	"context"
	"strings"
	"testing"

	"github.com/relaybus/relaybus/internal/instance"
)

func TestOpenNamesTheVariableOfABadTransport(t *testing.T) {
	for _, tc := range []struct {
		p    instance.PubSub
		want string
	}{
		{instance.PubSub{Transport: "kafka"}, `config: TRANSPORT="kafka": want pubsub or nats`},
		{instance.PubSub{Transport: "nats"}, "config: NATS_URL is required with TRANSPORT=nats"},
	} {
		b, err := Open(context.Background(), tc.p, "p")
		if err == nil || b != nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("Open(%+v) = %v, %v; want no broker and an error starting %q", tc.p, b, err, tc.want)
		}
	}
}
