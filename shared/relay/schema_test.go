package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/cloudevent"
	"github.com/relaybus/relaybus/internal/schema"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/relay"
)

// TestTopicWithSchemaIsPublishedInBinaryMode: on a topic with a schema
// (the repository's member.points.events), the message Pub/Sub receives has
// the payload alone as its data, which validates against the schema (what
// Pub/Sub checks), the CloudEvents and relaybus attributes as attributes, and
// reads back as the same event.
func TestTopicWithSchemaIsPublishedInBinaryMode(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	set, err := schema.Load(e.top)
	if err != nil {
		t.Fatal(err)
	}
	payload := `{"memberId":"m-1","orderId":"o-1","points":"12","balance":"40"}`
	in := &event.Event{ID: "pts-1", Type: "points.added", Source: "member-service", Topic: "member.points.events",
		AggregateType: "member", AggregateID: "m-1", Version: 1, Payload: []byte(payload), TraceID: "trace-1"}
	tx, _ := e.pool.Begin(ctx)
	if _, err := outbox.Enqueue(ctx, tx, in); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.relay(t, relay.Options{}).Drain(ctx, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, m := range e.fake.Server.Messages() {
		if m.Attributes[event.AttrEventID] != "pts-1" {
			continue
		}
		found = true
		if string(m.Data) != payload {
			t.Errorf("message data %s, want the payload alone (binary mode)", m.Data)
		}
		sc, ok := set.For("member.points.events", "v1")
		if !ok {
			t.Fatal("member.points.events declares no v1 schema")
		}
		if err := sc.Validate(m.Data); err != nil {
			t.Errorf("the message data does not validate against the topic's schema: %v", err)
		}
		for k, want := range map[string]string{"ce-specversion": "1.0", "ce-id": "pts-1", "ce-type": "points.added",
			"ce-source": "member-service", "ce-subject": "m-1", "ce-schemaversion": "v1", "content-type": "application/json",
			"event_type": "points.added", "aggregate_id": "m-1", "version": "1", "schema_version": "v1", "trace_id": "trace-1"} {
			if got := m.Attributes[k]; got != want {
				t.Errorf("attribute %s = %q, want %q", k, got, want)
			}
		}
		got, dec, err := cloudevent.Decode(event.Message{Data: m.Data, Attributes: m.Attributes, OrderingKey: m.OrderingKey}, event.Limits{})
		if err != nil {
			t.Fatalf("consume cannot read it: %v", err)
		}
		if dec.Mode != event.ModeBinary || got.ID != in.ID || got.Version != 1 || got.AggregateID != "m-1" ||
			got.Topic != "member.points.events" || string(got.Payload) != payload || got.TraceID != "trace-1" {
			t.Errorf("decoded (%s) %+v", dec.Mode, got)
		}
	}
	if !found {
		t.Fatal("the event was not published")
	}
}
