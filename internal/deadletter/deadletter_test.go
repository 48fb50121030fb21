package deadletter

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/relaybus/relaybus/shared/event"
)

func TestPoisonRoundTrip(t *testing.T) {
	orig := event.Message{ID: "m1", Data: []byte("x"), Attributes: map[string]string{"event_id": "e1"}, OrderingKey: "A", PublishTime: time.Unix(5, 0)}
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	dl := Poison(orig, "missing_aggregate_id", strings.Repeat("é", 800), "member-service", "projects/p/subscriptions/shop.order.events.member-service-processor", at)
	in := Read(dl)
	if in.Reason != "missing_aggregate_id" || in.Consumer != "member-service" || in.Subscription != "shop.order.events.member-service-processor" ||
		in.SourceMessageID != "m1" || !in.DeadLetteredAt.Equal(at) || len(in.Error) > 1003 || !strings.HasSuffix(in.Error, "…") {
		t.Fatalf("%+v", in)
	}
	if o := Original(dl); !reflect.DeepEqual(o.Attributes, orig.Attributes) || o.OrderingKey != "A" || string(o.Data) != "x" {
		t.Fatalf("original not restored: %+v", o)
	}
	if orig.Attributes["dead_letter_reason"] != "" {
		t.Fatal("Poison modified the original's attributes")
	}
}

func TestPubSubDeadLetterReadsAsMaxAttempts(t *testing.T) {
	orig := event.Message{Data: []byte("x"), Attributes: map[string]string{}, PublishTime: time.Unix(5, 0)}
	in := Read(PubSub(orig, "p", "shop.order.events.message-service-processor", 5))
	if in.Reason != ReasonMaxDeliveryAttempts || in.Consumer != "message-service" || in.Deliveries != 5 {
		t.Fatalf("%+v", in)
	}
}
