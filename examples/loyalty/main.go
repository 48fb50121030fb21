// Command loyalty is docs/consuming.md's example: a consume binary with its own
// handler in under 20 lines.
package main

import (
	"context"

	"github.com/relaybus/relaybus/functions/consume"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/event"
)

func init() {
	consume.RegisterHandler("loyalty", func(consume.HandlerConfig) (consumer.Handler, error) {
		mux := consumer.NewMux()
		mux.RegisterFunc("order.purchased", "v1", func(ctx context.Context, c *consumer.Context) error {
			if _, err := c.Tx.Exec(ctx, `UPDATE members SET orders = orders + 1 WHERE id = $1`, c.Event.AggregateID); err != nil {
				return err // transient: redelivered
			}
			return c.Emit(ctx, &event.Event{Type: "member.updated", Topic: "member.profile.events",
				AggregateID: c.Event.AggregateID, Version: c.Event.Version, Payload: []byte(`{}`)})
		})
		return mux, nil
	})
}

func main() { consume.Main() } // deploy with CONSUMER_HANDLER=loyalty
