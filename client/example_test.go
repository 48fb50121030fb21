package client_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/relaybus/relaybus/client"
	"github.com/relaybus/relaybus/shared/event"
)

// Publish an event, then learn which field of a bad one broke which rule.
// exampleEndpoint is a publish function the tests run on a real Postgres;
// in production it is the publish service's URL.
func ExampleClient_Publish() {
	c, err := client.New(exampleEndpoint, client.Options{Source: "order-service"})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	res, err := c.Publish(ctx, &event.Event{ID: "order-1001-purchased", Type: "order.purchased",
		Topic: "shop.order.events", AggregateID: "order-1001", Version: 1, Payload: []byte(`{"amount":42}`)})
	if err != nil {
		panic(err)
	}
	fmt.Println(res.EventID, res.Status)

	// Publishing it again (a retry, a restarted job) writes nothing.
	res, _ = c.Publish(ctx, &event.Event{ID: "order-1001-purchased", Type: "order.purchased",
		Topic: "shop.order.events", AggregateID: "order-1001", Version: 1, Payload: []byte(`{"amount":42}`)})
	fmt.Println("duplicate:", res.Duplicate)

	_, err = c.Publish(ctx, &event.Event{Type: "order.purchased", Topic: "shop.order.events",
		AggregateID: "order-1002", Version: 0, Payload: []byte(`{"amount":42}`)})
	var invalid *client.InvalidError
	if errors.As(err, &invalid) {
		for _, f := range invalid.Fields {
			fmt.Println(f.Field, "->", f.Rule)
		}
	}
	// Output:
	// order-1001-purchased pending
	// duplicate: true
	// version -> required: an integer of at least 1 (the aggregate's version after this event)
}
