package client_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/relaybus/relaybus/client"
)

// A scheduled event (DeliverAt) reaches publish in every mode: the result
// echoes its time and the outbox row holds it.
func TestPublishAScheduledEventInEveryMode(t *testing.T) {
	p := newPublish(t, nil)
	url := serve(t, p.handler)
	when := time.Now().Add(time.Hour).UTC().Truncate(time.Millisecond)
	for i, mode := range []client.Mode{client.ModeBinary, client.ModeStructured, client.ModeEnvelope} {
		t.Run(string(mode), func(t *testing.T) {
			c := newClient(t, url, client.Options{Mode: mode, Source: "order-service"})
			e := order(fmt.Sprintf("s-%d", i), 1)
			e.DeliverAt = when
			res, err := c.Publish(context.Background(), e)
			if err != nil {
				t.Fatal(err)
			}
			if res.Status != client.StatusPending || !res.DeliverAt.Equal(when) {
				t.Errorf("result %+v, want pending with deliverAt %s", res, when)
			}
			var stored time.Time
			if err := p.pool.QueryRow(context.Background(), `SELECT deliver_at FROM relaybus_outbox WHERE id = $1`, e.ID).Scan(&stored); err != nil || !stored.Equal(when) {
				t.Errorf("outbox deliver_at %v (%v), want %s", stored, err, when)
			}
		})
	}
}
